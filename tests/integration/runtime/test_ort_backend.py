"""The ONNX Runtime backend's session settings."""
import onnxruntime as ort

from dllm_deploy import Runtime


def test_sessions_take_the_threads_and_do_not_spin_and_leave_other_sessions_alone(tiny_artifact):
    """Both sessions of the loop: the threads asked for, spinning off (an idle session's spinning
    workers take the cores the other one needs); a plain session in the same process still loads
    (nothing process-wide was changed)."""
    rt = Runtime.load(artifact=str(tiny_artifact[0]), backend="ort", threads=2)
    for name, sess in rt.backend.sessions.items():
        so = sess.get_session_options()
        assert so.intra_op_num_threads == 2, name
        assert so.get_session_config_entry("session.intra_op.allow_spinning") == "0", name
    plain = ort.InferenceSession(str(tiny_artifact[0] / "verify.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in plain.get_inputs()] == rt.backend.names["verify"]["inputs"]
