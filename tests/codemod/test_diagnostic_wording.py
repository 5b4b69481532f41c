"""What a diagnostic says, where its code alone (the fixtures' .diagnostics files) cannot tell a wrong
message from a right one: the call it names, the reason it gives."""

from __future__ import annotations

from mgpu_migrate.engine import migrate_source
from tests.fixture_cases import FIXTURES


def _messages(name: str, target: str, code: str) -> list[str]:
    source = (FIXTURES / "shapes" / f"{name}.py").read_text()
    return [d.message for d in migrate_source(source, target, f"{name}.py").diagnostics if d.code == code]


def test_calls_before_the_wrap_are_not_where_the_wrapped_model_goes():
    # print_network(net) and init_weights(net, ...) run on the bare network, before it is wrapped.
    (message,) = _messages("escape_before_wrap", "ddp", "MGP262")
    assert "the caller of `define_generator()`" in message, message


def test_a_helper_called_under_a_main_process_block_saves_without_waiting_and_says_why():
    # Its save would wait for processes that never come: it waits for nobody, and nothing is left to hang.
    assert _messages("main_process_pairs", "ddp", "MGP249") == []
    (message,) = _messages("main_process_pairs", "ddp", "MGP123")
    assert message == (
        "mgpu_runtime.save(..., wait=False): written once, by the main process; no process waits, "
        "as line 38 calls it on the main process only"
    )
