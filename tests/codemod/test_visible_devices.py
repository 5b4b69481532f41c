"""MGP245 says where mgpu_runtime.setup() is, relative to a CUDA_VISIBLE_DEVICES assignment, as it is."""

from mgpu_migrate.engine import migrate_source

WRAP = "    model = nn.DataParallel(nn.Linear(2, 2))\n"


def _mgp245(source: str) -> list[str]:
    result = migrate_source(source, "ddp", "train.py")
    assert result.error is None
    return [f"{d.line}: {d.message}" for d in result.diagnostics if d.code == "MGP245"]


def test_after_the_inserted_setup():
    source = (
        "import os\nimport torch.nn as nn\n\n\ndef pick():\n    os.environ['CUDA_VISIBLE_DEVICES'] = '1'\n\n\n"
        f"def main():\n{WRAP}    pick()\n\n\nif __name__ == '__main__':\n    main()\n"
    )
    [message] = _mgp245(source)
    assert message.startswith("6: CUDA_VISIBLE_DEVICES is set after mgpu_runtime.setup() (inserted before line 15)")


def test_before_the_inserted_setup_is_fine():
    source = (
        "import os\nimport torch.nn as nn\n\n\ndef main():\n    os.environ['CUDA_VISIBLE_DEVICES'] = '1'\n"
        f"{WRAP}\n\nif __name__ == '__main__':\n    main()\n"
    )
    assert _mgp245(source) == []


def test_after_a_setup_the_file_already_calls():
    source = (
        "import os\nimport mgpu_runtime\nimport torch.nn as nn\n\n\ndef main():\n    mgpu_runtime.setup()\n"
        f"    os.environ['CUDA_VISIBLE_DEVICES'] = '1'\n{WRAP}"
    )
    [message] = _mgp245(source)
    assert message.startswith("8: CUDA_VISIBLE_DEVICES is set after mgpu_runtime.setup() (called at line 7)")


def test_no_setup_inserted_says_the_runtime_calls_it_when_first_used():
    source = f"import os\nimport torch.nn as nn\n\n\ndef build():\n    os.environ['CUDA_VISIBLE_DEVICES'] = '1'\n{WRAP}"
    [message] = _mgp245(source)
    assert message.startswith("6: CUDA_VISIBLE_DEVICES is set where mgpu_runtime.setup() may have run before it")
    assert "by the wrapper at line 7" in message
    assert "set after" not in message
