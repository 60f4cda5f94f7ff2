"""`dllm-deploy bench` / `report`: the JSON's structure and invariants (never speed), the tuner's
rules on a hand-made result, the overlay it writes, the plots and the generated markdown."""
import contextlib
import io
import json
from pathlib import Path

import pytest
import yaml

from dllm_deploy.bench import report
from dllm_deploy.bench import run as bench
from dllm_deploy.bench.targets import equal_quality, tune
from dllm_deploy.cli import main
from dllm_deploy.errors import UserError


@pytest.fixture(scope="module")
def bench_run(tiny_artifact, tmp_path_factory):
    d = tmp_path_factory.mktemp("bench")
    out, overlay, plots = d / "bench.json", d / "tuned.yaml", d / "plots"
    # the smoke run is `--quick` itself (2 tasks x 1 prompt, 2 repeats, W = 4, gen length 64)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):     # --json: the results on stdout, no table
        rc = main(["bench", "--artifact", str(tiny_artifact[0]), "--quick", "--json", "--json-out", str(out),
                   "--tune", "--tune-out", str(overlay), "--plots", str(plots)])
    assert rc == 0
    assert json.loads(printed.getvalue()) == json.loads(out.read_text())
    return json.loads(out.read_text()), out, overlay, plots


def test_json_is_a_flag_and_json_out_a_path(capsys):
    """--json PATH, the older spelling of --json-out PATH, still writes PATH and says so."""
    from dllm_deploy.cli import build_parser
    from dllm_deploy.cli.common import json_outputs
    for argv, want in ((["--json"], (True, None)), (["--json-out", "r.json"], (False, "r.json")),
                       (["--json", "--json-out", "r.json"], (True, "r.json")), (["--json", "r.json"], (False, "r.json"))):
        for command in (["bench", "--artifact", "a"], ["loadtest", "--url", "http://127.0.0.1:1"]):
            a = build_parser().parse_args(command + argv)
            json_outputs(a)
            assert (a.json, a.json_out) == want, (command, argv)
    assert "--json r.json is spelled --json-out r.json now" in capsys.readouterr().err
    a = build_parser().parse_args(["bench", "--artifact", "a", "--json", "x.json", "--json-out", "y.json"])
    with pytest.raises(UserError, match="give --json-out PATH alone"):
        json_outputs(a)


def test_bench_json_structure(bench_run):
    d = bench_run[0]
    assert {"machine", "versions", "profile", "runs", "ratios", "forward_cost", "targets", "tune"} <= set(d)
    labels = [r["label"] for r in d["runs"]]
    for be in ("ort", "torch"):
        assert f"{be}:vanilla no-cache" in labels and f"{be}:threshold tau0.9" in labels
        assert f"{be}:spd W4 lossless/vanilla" in labels and f"{be}:spd W4 threshold tau0.9" in labels
    for r in d["runs"]:
        assert r["repeats"] == 2
        assert r["tokens_per_s_min"] <= r["tokens_per_s"] <= r["tokens_per_s_max"]
        assert 0.0 <= r["loop_overhead"] <= 1.0 and r["time_per_forward_ms"] > 0
        assert r["tpf"] == pytest.approx(r["tokens"] / r["forwards"])
        assert r["beam_width_used"] == (r["beam_width"] if r["strategy"] == "spd" else 1)
        assert r["memory_estimate_mb"] > 0
        assert (r["modelled_tokens_per_s_memory_bound"] is None) == (r["cache"] == "none")
        # streamed: time to first token and between chunks (every decode is a stream)
        assert 0 < r["ttft_ms_p50"] <= r["ttft_ms_p99"] and 0 < r["chunk_gap_ms_p50"] <= r["chunk_gap_ms_p99"]
    by = {r["label"]: r for r in d["runs"]}
    # the same strategy on both backends decodes the same number of tokens
    assert by["ort:spd W4 lossless/vanilla"]["tokens"] == by["torch:spd W4 lossless/vanilla"]["tokens"]
    # LLaDA's no-cache vanilla and the cached lossless SPD W1 commit the same tokens, one per forward
    assert by["ort:vanilla no-cache"]["tpf"] <= 1.0
    assert "ort:spd W4 lossless/vanilla / torch" in d["ratios"]
    # memory estimate grows with W; forward cost curve covers every width, per backend
    assert by["ort:spd W4 lossless/vanilla"]["memory_estimate_mb"] > by["ort:threshold tau0.9"]["memory_estimate_mb"]
    assert d["families"] == ["upper", "count"] and d["gen_length"] == 64
    for be in ("ort", "torch"):
        assert [x["beam_width"] for x in d["forward_cost"][be]] == [1, 4]
        assert all(x["ms_min"] <= x["ms"] <= x["ms_max"] for x in d["forward_cost"][be])
    assert len(d["targets"]) >= 4 and all({"target", "goal", "measured", "met"} <= set(t) for t in d["targets"])


def test_tune_picks_the_fastest_at_equal_quality_and_overlay_loads(bench_run):
    d, _, overlay, _ = bench_run
    by = {r["label"]: r for r in d["runs"]}
    pick, ref = by[d["tune"]["pick"]], by[d["tune"]["reference"]]
    assert ref["label"] == "torch:vanilla no-cache" and d["tune"]["quality_budget"] == 0.01
    within = [r for r in d["runs"] if r["backend"] == "ort" and r["accuracy"] >= ref["accuracy"] - 0.01 - 1e-9]
    assert pick["backend"] == "ort" and pick in within
    assert pick["tokens_per_s"] == max(r["tokens_per_s"] for r in within)
    raw = yaml.safe_load(overlay.read_text())
    from dllm_deploy.profiles import parse_profile
    prof = parse_profile(raw, str(overlay))
    assert prof.decode["beam_width"] == pick["beam_width_used"]
    assert raw["tuned"]["pick"] == pick["label"]
    # the equal-quality headline of the same run names the same pick for ort
    assert d["equal_quality"]["backends"]["ort"]["pick"] == pick["label"]
    assert d["targets"][0]["target"].startswith("Equal quality")


def _run(label, strategy, tps, acc, w=1, select="lossless", base="vanilla", tau=0.9, backend="ort", cache="auto"):
    return {"label": label, "backend": backend, "strategy": strategy, "tokens_per_s": tps, "accuracy": acc,
            "beam_width": w, "beam_width_used": w, "select": select, "base": base, "threshold": tau, "tree": "chain",
            "cache": cache, "tpf": 1.0}


def test_configurations_per_backend_strategies_and_dynamic_tau():
    cs = bench.configurations(["torch:vanilla", "ort"], ["vanilla", "threshold"], [4], [0.9, 0.95], threshold_floors=[0.9])
    assert [c.label for c in cs] == ["torch:vanilla no-cache", "ort:vanilla no-cache", "ort:threshold tau0.9",
                                     "ort:threshold tau0.95", "ort:threshold tau0.95>0.9"]
    assert cs[-1].decode_kwargs(64)["threshold_floor"] == 0.9 and "threshold_floor" not in cs[-2].decode_kwargs(64)
    fars = bench.configurations(["ort"], ["threshold"], [4], [0.9, 0.999], threshold_fars=[0.99])
    assert [c.label for c in fars] == ["ort:threshold tau0.9", "ort:threshold tau0.999", "ort:threshold tau0.9 far0.99"]
    assert fars[-1].decode_kwargs(64)["threshold_far"] == 0.99 and "threshold_far" not in fars[0].decode_kwargs(64)
    leads = bench.configurations(["ort"], ["threshold"], [4], [0.9, 0.999], threshold_fars=[0.99], threshold_leads=[0.7, 0.95])
    assert [c.label for c in leads[3:]] == ["ort:threshold tau0.9 far0.99 lead0.7", "ort:threshold tau0.999 lead0.7",
                                           "ort:threshold tau0.999 lead0.95"]
    assert leads[3].decode_kwargs(64)["threshold_lead"] == 0.7 and "threshold_lead" not in leads[2].decode_kwargs(64)


def test_tune_and_equal_quality_rules():
    runs = [_run("llada", "vanilla", 10.0, 0.80, backend="torch", cache="none"), _run("van", "vanilla", 20.0, 0.80),
            _run("thr", "threshold", 100.0, 0.795), _run("fast-bad", "spd", 300.0, 0.5, w=8),
            _run("fast-ok", "spd", 150.0, 0.78, w=4), _run("slow", "spd", 90.0, 0.9, w=2)]
    t = tune({"runs": runs}, quality_budget=0.02)
    assert t["pick"]["label"] == "fast-ok" and t["baseline"]["label"] == "thr"   # fastest within 2 points
    t = tune({"runs": runs}, quality_budget=0.01)
    assert t["pick"]["label"] == "thr" and t["reference"]["label"] == "llada"
    t = tune({"runs": runs}, quality_budget=0.0)
    assert t["pick"]["label"] == "slow"             # only runs at least as accurate as the reference
    eq = equal_quality(runs, 0.01)
    assert eq["reference"] == "llada" and eq["backends"]["ort"]["pick"] == "thr"
    assert eq["backends"]["ort"]["vs_llada"] == pytest.approx(10.0)
    assert eq["backends"]["ort"]["any_quality_pick"] == "fast-bad" and eq["backends"]["ort"]["any_quality_vs_llada"] == 30.0
    with pytest.raises(UserError, match="vanilla reference"):
        tune({"runs": [r for r in runs if r["strategy"] != "vanilla"]})


def test_report_markdown_and_plots(bench_run, tmp_path):
    d, path, _, _ = bench_run
    doc = tmp_path / "docs" / "BENCHMARKS.md"
    rc = main(["report", str(path), "--out", str(doc), "--plots", str(tmp_path / "plots")])
    assert rc == 0
    text = doc.read_text()
    for r in d["runs"]:
        assert f"| {r['label']} |" in text
    assert "## Targets" in text and "modelled" in text
    pngs = sorted((tmp_path / "plots").glob("*.png"))
    assert [p.stem for p in pngs] == sorted(report.PLOTS)
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    assert all(f"]({'../plots/' + p.name})" in text for p in pngs)   # links relative to the doc


def test_report_adds_the_serving_load_table(tmp_path):
    """The committed bench and load-test results give the load section, its ratios computed from the
    load JSON (tokens/s of one level, three servers measured in one run); a bad load file: one line."""
    root = Path(__file__).resolve().parents[3]
    load = json.loads((root / "lab" / "load-ab.json").read_text())
    doc = tmp_path / "B.md"
    assert main(["report", str(root / "lab" / "bench.json"), "--out", str(doc),
                 "--load-test", str(root / "lab" / "load-ab.json")]) == 0
    text = doc.read_text()
    assert "## Serving load test" in text
    for c, r in load["levels"].items():
        one, cont = r["one-at-a-time"]["tokens_per_s"], r["continuous"]["tokens_per_s"]
        assert f"| {c} | {one:.1f} |" in text and f"| {cont / one:.2f}x |" in text
    (tmp_path / "bad.json").write_text('{"runs": []}')
    assert main(["report", str(root / "lab" / "bench.json"), "--load-test", str(tmp_path / "bad.json")]) == 2


def test_report_adds_the_peers_table_and_plot(tmp_path, capsys):
    """--peers: each committed peer run's engines with their ratios to the run's first engine,
    computed from the peer JSON, and a tokens/s plot linked from the doc; a bad file: one line."""
    root = Path(__file__).resolve().parents[3]
    peers = sorted((root / "lab" / "peers").glob("*.json"))
    doc = tmp_path / "docs" / "B.md"
    assert main(["report", str(root / "lab" / "bench.json"), "--out", str(doc), "--plots", str(tmp_path / "plots"),
                 "--peers", *map(str, peers)]) == 0
    text = doc.read_text()
    assert "## Peers" in text and "](../plots/peers.png)" in text and (tmp_path / "plots" / "peers.png").stat().st_size
    for path in peers:
        rows = json.loads(path.read_text())["rows"]
        if (layout := json.loads(path.read_text()).get("layout")):      # the checkpoint's layout, in the setup
            assert any(x.startswith(f"| `{path}` | {layout} layout, prompt ") for x in text.splitlines()), layout
        for r in rows:
            assert (f"| {r['engine']} | {r['forwards']} | {r['ms_per_forward']:.1f} | {r['tokens_per_s']:.2f} "
                    f"| {rows[0]['ms_per_forward'] / r['ms_per_forward']:.2f}x "
                    f"| {r['tokens_per_s'] / rows[0]['tokens_per_s']:.2f}x |") in text
        ident = json.loads(path.read_text()).get("identity")
        if ident:       # the token identity check, in words: identical, or where the texts part and our margin there
            line = next(x for x in text.splitlines() if x.startswith(f"- `{path}`"))
            assert ("the same text from both engines" in line) == ident["identical_text"]
            if not ident["identical_text"]:
                assert f"token {ident['first_difference_token']}, " in line
                assert f"by {ident['our_margin_there']['margin']:.2g} " in line
        for engine, why in json.loads(path.read_text()).get("failed", {}).items():     # a peer that crashed: said
            assert f"- `{path}`: {engine} did not run ({why})" in text
    capsys.readouterr()
    (tmp_path / "bad.json").write_text('{"rows": [{"engine": "x"}]}')
    assert main(["report", str(root / "lab" / "bench.json"), "--peers", str(tmp_path / "bad.json")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"dllm-deploy: error: {tmp_path / 'bad.json'}: not a peers result (rows of engine, forwards, ms_per_forward, "
        "tokens_per_s; run lab/peers/llama_cpp.sh)"]


def test_report_shows_equal_quality_of_both_runs(tmp_path):
    """--compare: the other run's equal-quality picks beside this run's, recomputed from its runs."""
    root = Path(__file__).resolve().parents[3]
    src = root / "lab" / "bench.json"
    doc = tmp_path / "B.md"
    assert main(["report", str(src), "--compare", str(src), "--compare-label", "distilled", "--out", str(doc)]) == 0
    text = doc.read_text()
    res = json.loads(src.read_text())
    eq = equal_quality(res["runs"])
    assert "## Speed at equal quality" in text
    for name in ("distilled", "this run"):
        e = eq["backends"]["ort"]
        assert f"| {name} | ort | {e['pick']} | {e['accuracy']:.3f} |" in text
    assert main(["report", str(src), "--compare", str(tmp_path / "nope.json")]) == 2


def test_report_rejects_non_bench_json(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('{"a": 1}')
    assert main(["report", str(bad)]) == 2


def test_bench_bad_input(tiny_artifact):
    assert main(["bench", "--artifact", str(tiny_artifact[0]), "--strategies", "nope", "--quiet"]) == 2
    assert main(["bench", "--artifact", str(tiny_artifact[0]), "--tasks", "nope", "--quiet"]) == 2
    assert main(["bench", "--artifact", str(tiny_artifact[0]), "--beam-widths", "64", "--strategies", "spd", "--quiet"]) == 2


def test_tuned_overlay_is_used_and_explained(bench_run, tiny_artifact, tmp_path, monkeypatch, capsys):
    d, _, overlay, _ = bench_run
    folder = tmp_path / "profiles"
    folder.mkdir()
    (folder / overlay.name).write_text(overlay.read_text())
    monkeypatch.setenv("DLLM_DEPLOY_PROFILES", str(folder))
    raw = yaml.safe_load(overlay.read_text())
    assert main(["profiles", "explain", "auto"]) == 0
    out = capsys.readouterr().out
    assert f"profile {raw['name']}" in out and "bench --tune" in out and raw["tuned"]["pick"] in out
    from dllm_deploy import Runtime
    rt = Runtime.load(artifact=str(tiny_artifact[0]))
    assert rt.profile.name == raw["name"]
    cfg = rt.decode_config()                       # no options given: the overlay's defaults
    assert (cfg.strategy, cfg.beam_width, cfg.threshold) == (raw["decode"]["strategy"], raw["decode"]["beam_width"],
                                                            raw["decode"]["threshold"])
    assert rt.decode_config(beam_width=1).beam_width == 1   # an explicit option still wins


def test_forward_cost_keeps_a_prefix_at_the_widest_tree(tiny_artifact):
    """W*L = 512 fills the tiny model's whole context; the cost curve's prefix must not vanish with
    it (a zero-token prefill fails in ONNX Runtime's Reshape)."""
    from dllm_deploy import Runtime
    rt = Runtime.load(artifact=str(tiny_artifact[0]), backend="ort", threads=1)
    cfg = rt.config
    prefix = bench.cost_prefix(cfg.max_seq, cfg.block_size, 128)
    assert prefix == 128 and bench.cost_prefix(512, 32, 1024) == 480
    (row,) = bench.forward_cost(rt.backend, cfg, [16], cfg.block_size, prefix, repeats=1)
    assert row["prefix"] == 128 and row["tokens"] == 16 * 32 and row["ms"] > 0


def test_sampling_runs_beside_greedy_ones(tiny_artifact):
    configs = bench.configurations(["ort"], ["vanilla", "threshold"], [4], [0.9], seeds=[1, 2])
    assert [c.label for c in configs] == ["ort:vanilla no-cache", "ort:threshold tau0.9",
                                          "ort:threshold tau0.9 T0.7 p0.9 seed1", "ort:threshold tau0.9 T0.7 p0.9 seed2"]
    assert configs[0].row is None and (configs[2].row.temperature, configs[2].row.top_p, configs[2].row.seed) == (0.7, 0.9, 1)
    res = bench.run_bench(str(tiny_artifact[0]), backends=["ort"], strategies=["threshold"], beam_widths=[1],
                          families=["upper"], n=1, repeats=1, gen_length=32, cost_repeats=1, seeds=[1])
    greedy, sampled = res["runs"]
    assert sampled["temperature"] == 0.7 and sampled["seed"] == 1 and greedy["temperature"] == 0
    assert sampled["tokens"] > 0 and sampled["ttft_ms_p50"] > 0
    assert all(t["measured"] is None or "T0.7" not in t["note"] for t in res["targets"])   # targets: greedy runs


def test_precisions_are_configurations_of_their_own(tiny_artifact, tmp_path):
    """--precisions: every ONNX Runtime configuration again in each quantized variant (never torch);
    the run measures each on its own graphs, and --tune's overlay carries the pick's precision."""
    cs = bench.configurations(["torch:vanilla", "ort"], ["vanilla", "threshold"], [4], [0.9], precisions=["fp32", "int8"])
    assert [c.label for c in cs] == ["torch:vanilla no-cache", "ort:vanilla no-cache", "ort:threshold tau0.9",
                                     "ort:vanilla no-cache int8", "ort:threshold tau0.9 int8"]
    assert "precision" not in cs[-1].decode_kwargs(64)
    res = bench.run_bench(str(tiny_artifact[0]), backends=["ort"], strategies=["threshold"], beam_widths=[1],
                          thresholds=[0.9], families=["upper"], n=1, repeats=1, gen_length=32, cost_repeats=1,
                          precisions=["fp32", "int8"])
    fp32, int8 = res["runs"]
    assert (fp32["precision"], int8["precision"]) == ("fp32", "int8") and int8["label"] == "ort:threshold tau0.9 int8"
    assert set(res["forward_cost"]) == {"ort", "ort int8"}
    assert int8["memory_estimate_mb"] < fp32["memory_estimate_mb"] and int8["tokens"] > 0
    md = report.markdown(res)
    assert "configurations in fp32 and int8" in md and "| ort int8 |" in md      # workload line, forward cost
    slow_fp32 = _run("ref", "vanilla", 10.0, 0.9, backend="torch", cache="none")
    picked = {**_run("ort:threshold tau0.9 int8", "threshold", 100.0, 0.9), "precision": "int8", "beam_width_used": 1}
    from dllm_deploy.profiles import get_profile
    t = tune({"runs": [slow_fp32, picked]})
    overlay = bench.overlay_profile(t, get_profile("auto")[0], None)
    assert overlay["precision"] == "int8" and overlay["tuned"]["pick"] == "ort:threshold tau0.9 int8"


def test_cache_modes_are_configurations_of_their_own(tiny_artifact, capsys):
    """--caches: the threshold configurations again in each cache mode (vanilla and spd are not);
    the run decodes each in its mode, and --tune's overlay carries the pick's cache mode."""
    cs = bench.configurations(["torch:vanilla", "ort"], ["vanilla", "threshold", "spd"], [4], [0.9], caches=["auto", "delayed"],
                              precisions=["fp32", "int8"])
    labels = [c.label for c in cs]
    assert labels[:3] == ["torch:vanilla no-cache", "ort:vanilla no-cache", "ort:threshold tau0.9"]
    assert "ort:threshold tau0.9 delayed" in labels and "ort:threshold tau0.9 delayed int8" in labels
    assert not any("spd" in x and "delayed" in x for x in labels)
    only = bench.configurations(["ort"], ["threshold"], [4], [0.9], caches=["delayed"])
    assert [c.label for c in only] == ["ort:threshold tau0.9 delayed"] and only[0].decode_kwargs(64)["cache"] == "delayed"
    res = bench.run_bench(str(tiny_artifact[0]), backends=["ort"], strategies=["threshold"], beam_widths=[1],
                          thresholds=[0.99], families=["count"], n=1, repeats=1, gen_length=64, cost_repeats=1,
                          caches=["auto", "delayed"])
    exact, delayed = res["runs"]
    assert (exact["cache"], delayed["cache"]) == ("auto", "delayed") and delayed["tokens"] > 0
    assert delayed["fed_per_token"] < exact["fed_per_token"]       # the tokens each forward carries
    assert "under delayed (a label naming delayed ran under it" in report.markdown(res)
    ref = _run("ref", "vanilla", 10.0, 0.9, backend="torch", cache="none")
    picked = {**_run("ort:threshold tau0.9 delayed", "threshold", 100.0, 0.9, cache="delayed"), "beam_width_used": 1}
    from dllm_deploy.profiles import get_profile, parse_profile
    overlay = bench.overlay_profile(tune({"runs": [ref, picked]}), get_profile("auto")[0], None)
    assert overlay["decode"]["cache"] == "delayed" and parse_profile(overlay, "overlay").decode["cache"] == "delayed"
    assert main(["bench", "--artifact", str(tiny_artifact[0]), "--caches", "auto,triple", "--quiet"]) == 2
    assert "unknown cache mode 'triple'" in capsys.readouterr().err


def test_bench_refuses_a_precision_the_artifact_lacks(tiny_artifact, capsys):
    assert main(["bench", "--artifact", str(tiny_artifact[0]), "--precisions", "fp16", "--quiet"]) == 2
    assert "no fp16 variant" in capsys.readouterr().err
    assert main(["bench", "--artifact", str(tiny_artifact[0]), "--precisions", "int3", "--quiet"]) == 2
