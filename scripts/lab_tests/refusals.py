"""What a lab script's bad argument must give: argparse's exit code 2 and one line, no traceback."""

from __future__ import annotations

import pytest


def refusal(capsys, main, *argv: str) -> str:
    """``main(argv)`` must exit 2 without a traceback on stderr; its last line there."""
    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    assert exc.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(lines)
    return lines[-1]
