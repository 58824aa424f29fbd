"""What pilots, payloads and compute elements wrote reaches the operator's terminal as text,
never as commands to it: the client leaves out the control characters but newline and tab."""

from __future__ import annotations

import pytest

from client.show import pilot_log, printable

#: Each sequence a terminal obeys, and what is left of it once printable.
ATTACKS = [
    ("\x1b]52;c;cm0gLXJmIH4=\x07", "]52;c;cm0gLXJmIH4="),  # OSC 52: write the clipboard
    ("\x1b]0;owned\x1b\\", "]0;owned\\"),                 # OSC 0: the window title
    ("\x1b[2J\x1b[H", "[2J[H"),                           # CSI: clear the screen
    ("\x1b[8mhidden\x1b[0m", "[8mhidden[0m"),             # SGR 8: invisible text
    ("\x9b2J\x9d0;t\x9c", "2J0;t"),                       # C1 controls: CSI, OSC, ST
    ("abc\u202edcba", "abcdcba"),                          # right-to-left override
    ("\u2066x\u2069\u200f", "x"),                          # isolates and marks
    ("100%\rdone", "100%done"),                            # CR rewrites the line
    ("bell\x07 nul\x00 del\x7f bs\x08", "bell nul del bs"),
]


@pytest.mark.parametrize(("text", "shown"), ATTACKS)
def test_control_characters_are_left_out(text: str, shown: str) -> None:
    assert printable(text) == shown


def test_newline_tab_and_other_scripts_stay() -> None:
    text = "line 1\n\tindented\nnaïve Ωμέγα 漢字 \U0001f600 \ufffd\n"
    assert printable(text) == text


def test_a_pilot_log_prints_without_escapes() -> None:
    shown = printable(pilot_log({
        "reference": "arc-\x1b[2J", "status": "Done", "exit_code": 0,
        "stdout": "matched job 7\r\n\x1b]52;c;ZXZpbA==\x07idle\n", "stderr": "\x9b8m\u202e"}))
    assert not any(c in shown for c in "\x1b\x07\r\x9b\u202e")
    assert "matched job 7\n]52;c;ZXZpbA==idle" in shown


def test_a_user_s_pilot_log_says_what_was_left_out() -> None:
    shown = pilot_log({"reference": "arc-1", "status": "Done", "stdout": "", "stderr": "x\n",
                       "hidden_lines": 4})
    assert "note: 4 line(s) about other jobs on this pilot are left out" in shown
    assert "left out" not in pilot_log({"reference": "arc-1", "status": "Done", "stdout": "",
                                        "stderr": "", "hidden_lines": 0})
