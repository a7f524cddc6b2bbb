"""bakery.progress.step: silent off a terminal, a done line when shown."""

from bakery.progress import step


def test_hidden_off_a_terminal(capsys):
    with step("placing 12 patch(es)") as advance:
        advance()  # a no-op, never an error
    assert capsys.readouterr().err == ""


def test_a_shown_bar_ends_with_a_done_line(capsys):
    with step("capturing 3 case(s)", 3, show=True) as advance:
        for _ in range(3):
            advance()
    assert capsys.readouterr().err.splitlines()[-1] == "✓ capturing 3 case(s)"


def test_show_false_wins_over_everything(capsys):
    with step("capturing 3 case(s)", 3, show=False) as advance:
        advance()
    assert capsys.readouterr().err == ""
