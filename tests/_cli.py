"""Running the `ratrain` command in-process, for tests of its one-line errors."""

from ratrain.cli import main


def one_line_error(cap, argv: list[str], *needles: str) -> str:
    """`ratrain ARGV` exits 2 with one line on stderr, no traceback, holding every needle;
    `cap` is pytest's capsys or capfd. Returns the line."""
    assert main(argv) == 2
    err = cap.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    for n in needles:
        assert n in err, err
    return err
