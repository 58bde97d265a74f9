"""`chatqna bench`'s grid options: one not given is the service's setting, as its help says."""

from __future__ import annotations

import typer

from chatqna.cli import app
from chatqna.evaluation.options import SERVICE_DEFAULTS, with_service_defaults
from chatqna.settings import Settings


def test_each_grid_option_names_the_setting_it_defaults_to() -> None:
    bench = typer.main.get_group(app).commands["bench"]
    helps = {param.name: getattr(param, "help", None) or "" for param in bench.params}
    for option, variable in SERVICE_DEFAULTS.items():
        assert helps[option].endswith(f"(default: the service's setting, {variable.upper()})")


def test_every_default_is_a_setting() -> None:
    assert set(SERVICE_DEFAULTS.values()) <= set(Settings.model_fields)


def test_an_option_not_given_is_the_setting_typed_and_one_given_is_kept() -> None:
    settings = Settings(multi_turn_blend_alpha=0.65, rrf_bm25_weight=0.2)
    options = {name: None for name in SERVICE_DEFAULTS} | {"history_turns": "4,6", "llm": False}
    filled = with_service_defaults(options, settings)
    assert filled["alphas"] == "0.65" and filled["bm25_weights"] == "0.2"
    assert filled["history_order"] == "newest_first" and filled["history_roles"] == "user_assistant"
    assert filled["self_contained_similarities"] == "0.4"
    assert filled["history_turns"] == "4,6" and filled["llm"] is False
