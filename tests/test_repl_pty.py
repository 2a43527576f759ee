"""`llogos chat` in a real pseudo-terminal: turns, commands, Ctrl-C and Ctrl-D as a user types them."""

import json
import sys

import pexpect
import pytest

from llogos_cli.model.loader import open_tokenizer
from llogos_cli.paths import PROJECT_ROOT
from tests.conftest import interruptible, subprocess_env

QUESTION = "What is the capital of France? Answer in one word."   # decisive at every token, with any products
PROMPT = "\r\n> "


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    return subprocess_env(tmp_path_factory, TERM="dumb")


class Terminal:
    def __init__(self, env, *args):
        self.child = pexpect.spawn(sys.executable, ["-m", "llogos_cli", "chat", "-m", "smollm2-135m", "--temp", "0",
                                                    *args], env=env, cwd=str(PROJECT_ROOT),
                                   encoding="utf-8", timeout=120, dimensions=(24, 200), preexec_fn=interruptible)
        self.child.expect_exact("Ctrl-D to leave")
        self.child.expect_exact("> ")

    def say(self, line: str) -> str:
        """Type a line and return what came back before the next prompt."""
        self.child.send(line + "\r")
        self.child.expect_exact(line + "\r\n")
        self.child.expect_exact(PROMPT)
        return self.child.before.replace("\r\n", "\n")

    def leave(self, key: str) -> int:
        self.child.send(key)
        self.child.expect(pexpect.EOF)
        self.child.close()
        return self.child.exitstatus

    def saved(self, path) -> list[dict]:
        assert "saved" in self.say(f"/save {path}")
        return json.loads(path.read_text())


@pytest.fixture
def terminal(env, smollm_path):
    opened = []

    def start(*args) -> Terminal:
        opened.append(Terminal(env, *args))
        return opened[-1]
    yield start
    for term in opened:   # a failed test leaves its chat running
        if term.child.isalive():
            term.child.terminate(force=True)


def test_multi_turn_regen_and_clear(terminal, tmp_path):
    term = terminal("-n", "12")
    first = term.say(QUESTION)
    assert "Paris" in first
    second = term.say("And of Germany?")
    assert second.strip() and second != first
    assert term.say("/regen") == second                      # greedy: the same reply, replacing the old one
    assert term.saved(tmp_path / "a.json") == [
        {"role": "user", "content": QUESTION}, {"role": "assistant", "content": first},
        {"role": "user", "content": "And of Germany?"}, {"role": "assistant", "content": second}]
    assert "new conversation" in term.say("/clear")
    assert term.saved(tmp_path / "b.json") == []
    assert term.say(QUESTION) == first
    assert term.leave("\x04") == 0                           # Ctrl-D


def test_ctrl_c_stops_the_reply_and_keeps_it(terminal, tmp_path):
    """The reply cannot end by itself (its end-of-generation tokens banned, no token limit, the
    context shifted), so only the Ctrl-C can stop it, however fast the machine runs: the test waits
    for that, not for a number of words."""
    bans = [arg for token in sorted(open_tokenizer("smollm2-135m").eog_ids) for arg in ("-l", f"{token}-inf")]
    term = terminal("-n", "-1", "-c", "512", *bans)
    story = "Write a long story about a dragon."
    term.child.send(story + "\r")
    term.child.expect_exact(story + "\r\n")
    term.child.expect(r"\w+ \w+ \w+")                        # the reply is streaming
    streamed = term.child.before + term.child.after
    term.child.send("\x03")
    term.child.expect_exact("(reply interrupted)")
    shown = (streamed + term.child.before).replace("\r\n", "\n").replace("^C", "")   # less the terminal's echo
    term.child.expect_exact("> ")
    messages = term.saved(tmp_path / "a.json")
    assert [m["role"] for m in messages] == ["user", "assistant"]
    partial = messages[1]["content"]
    assert partial.startswith(streamed.replace("\r\n", "\n")) and partial.strip() == shown.strip()   # kept as shown
    term.child.send("some text")                             # Ctrl-C with text typed discards the line
    term.child.send("\x03")
    term.child.expect_exact("> ")
    assert term.saved(tmp_path / "b.json") == messages
    assert term.leave("\x03") == 0                           # Ctrl-C at an empty prompt leaves


def test_load_system_and_multi_line_input(terminal, tmp_path):
    conv = tmp_path / "conv.json"
    conv.write_text(json.dumps([{"role": "user", "content": QUESTION}, {"role": "assistant", "content": "Paris."}]))
    term = terminal("-n", "8")
    assert "/regen" in term.say("/help")
    assert "unknown command /frobnicate" in term.say("/frobnicate")
    assert "loaded 2 messages" in term.say(f"/load {conv}")
    assert "system prompt set" in term.say("/system You are terse.")
    term.child.send("And what about\\\r")
    term.child.expect_exact("... ")
    reply = term.say("Germany?")
    assert reply.strip()
    assert term.saved(tmp_path / "out.json") == [
        {"role": "system", "content": "You are terse."}, {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": "Paris."}, {"role": "user", "content": "And what about\nGermany?"},
        {"role": "assistant", "content": reply}]
    assert term.leave("/exit\r") == 0
