"""Training with torch (the tiny models' recipes, certainty-forcing distillation): on no deploy
path (the import contracts in pyproject.toml keep runtime, export, profiles, serving and models
from importing it)."""
