"""One plain line per step when stdout is not a terminal (cli/steplog.py)."""

import io

from tidal.cli import steplog


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_step_line_and_printer():
    row = {"step": 2, "loss": 5.43214, "tokens_per_s": 12345.6, "strategy": "tp2+2*tp1", "wall_s": 0.5219}
    assert steplog.step_line(row, 20, 3 * 2**30 // 2) == \
        "step 3/20 | loss 5.4321 | 12,346 tok/s | tp2+2*tp1 | mem 1.50 GiB | 0.52 s"
    out = io.StringIO()
    on_step = steplog.printer(20, out)
    on_step(row)
    on_step({**row, "step": 3})
    lines = out.getvalue().splitlines()
    assert [x.split(" | ")[0] for x in lines] == ["step 3/20", "step 4/20"]
    assert float(lines[0].split("mem ")[1].split(" GiB")[0]) > 0  # this process's peak RSS
    assert steplog.plain_output(io.StringIO()) and not steplog.plain_output(_Tty())
