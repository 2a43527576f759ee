"""The interactive chat loop: reading messages, running commands, streaming replies.

Replies go to stdout; the prompt marker, notices and errors go to the terminal through rich on
stderr, except that input() writes its prompt where readline does (stdout when it is a terminal).
"""

import re
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from llogos_cli.console import err, error, notice
from llogos_cli.engine.chat import Chat
from llogos_cli.engine.conversation import Message, read_messages, write_messages
from llogos_cli.errors import LlogosError

HELP = """\
/help          this list
/exit          leave (Ctrl-D does too, as does Ctrl-C at an empty prompt)
/clear         start a new conversation, keeping the system prompt
/regen         replace the last reply with a new one
/system TEXT   set the system prompt (without TEXT: show it)
/save FILE     write the conversation to FILE as JSON messages
/load FILE     replace the conversation with the one in FILE
/stats         timings of the last reply
End a line with \\ to continue the message on the next line.
Ctrl-C while the model replies stops the reply and keeps what it wrote."""


def stream(text: str) -> None:
    """Show a piece of a reply as soon as it is generated."""
    sys.stdout.write(text)
    sys.stdout.flush()


class ReplyOutput:
    """A reply as it comes: its reasoning dim on stderr (progress, not the result), a line break
    once the answer starts, and the answer on stdout."""

    def __init__(self):
        self.thinking = False

    def think(self, text: str) -> None:
        self.thinking = True
        err.print(text, style="dim", end="", markup=False, highlight=False, soft_wrap=True)
        err.file.flush()

    def answer(self, text: str) -> None:
        if text:
            self.end()
        stream(text)

    def end(self) -> None:
        """Close the reasoning's line, when the reply ended in it."""
        if self.thinking:
            self.thinking = False
            err.print("", markup=False)


class _Exit(Exception):
    """The user asked to leave."""


@dataclass(slots=True)
class _ReplyInterrupts:
    """While a reply streams, the first Ctrl-C asks it to stop after the current token; a second
    one interrupts at once (useful during a long prefill), at the price of a rebuilt context."""
    requested: bool = False
    previous: object = None

    def __enter__(self) -> "_ReplyInterrupts":
        self.previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc) -> None:
        signal.signal(signal.SIGINT, self.previous)


class Repl:
    def __init__(self, chat: Chat, simple_io: bool, show_stats: bool):
        self.chat = chat
        self.show_stats = show_stats
        self.readline = None
        if not simple_io and sys.stdin.isatty() and sys.stdout.isatty():
            import readline  # line editing and history for input(); importing it is what enables them
            self.readline = readline
        style = Console(highlight=False, color_system=None if simple_io else "auto")
        self.prompt = self._styled(style, "[bold green]>[/bold green] ")
        self.more = self._styled(style, "[dim]...[/dim] ")

    def _styled(self, console: Console, markup: str) -> str:
        with console.capture() as cap:
            console.print(markup, end="")
        text = cap.get()
        # readline must be told which characters take no room on screen, or line editing goes astray.
        return re.sub(r"(\x1b\[[0-9;]*m)", "\x01\\1\x02", text) if self.readline else text

    def run(self) -> None:
        if self.chat.messages and self.chat.messages[-1].role == "user":
            self._reply(regenerate=False)
        while True:
            try:
                text = self._read_message()
            except _Exit:
                return
            if text is None:
                continue
            try:
                if text.startswith("/"):
                    self._command(text)
                elif text.strip():
                    self.chat.messages.append(Message("user", text))
                    self._reply(regenerate=False)
            except _Exit:
                return
            except LlogosError as e:
                error(str(e))

    # ---- input -------------------------------------------------------------------------------

    def _input(self, prompt: str) -> str:
        if sys.stdout.isatty():
            return input(prompt)
        err.print(prompt, end="", markup=False, highlight=False)   # keep stdout for replies
        return input()

    def _read_message(self) -> str | None:
        """One message, joining lines that end with a backslash. None: the typing was discarded."""
        lines = []
        while True:
            try:
                line = self._input(self.more if lines else self.prompt)
            except EOFError:
                err.print()
                raise _Exit from None
            except KeyboardInterrupt:
                typed = lines or (self.readline is not None and self.readline.get_line_buffer())
                err.print()
                if not typed:
                    raise _Exit from None
                return None
            if line.endswith("\\"):
                lines.append(line[:-1])
                continue
            return "\n".join([*lines, line])

    # ---- commands ------------------------------------------------------------------------------

    def _command(self, text: str) -> None:
        name, _, arg = text.partition(" ")
        arg = arg.strip()
        chat = self.chat
        if name in ("/exit", "/quit"):
            raise _Exit
        if name == "/help":
            err.print(escape(HELP), highlight=False)
        elif name == "/clear":
            chat.clear()
            notice("new conversation")
        elif name == "/regen":
            self._reply(regenerate=True)
        elif name == "/system":
            if arg:
                chat.set_system(arg)
                notice("system prompt set")
            else:
                notice(f"system prompt: {chat.system}" if chat.system is not None else "no system prompt")
        elif name == "/save":
            write_messages(Path(_need(arg, name)), chat.messages)
            notice(f"saved {len(chat.messages)} messages to {arg}")
        elif name == "/load":
            chat.messages = read_messages(Path(_need(arg, name)))
            notice(f"loaded {len(chat.messages)} messages from {arg}")
            if chat.messages and chat.messages[-1].role == "user":
                self._reply(regenerate=False)
        elif name == "/stats":
            notice(chat.last.summary() if chat.last else "no reply yet")
        else:
            error(f"unknown command {name} (/help lists them)")

    # ---- replies -------------------------------------------------------------------------------

    def _reply(self, regenerate: bool) -> None:
        n_before = len(self.chat.messages)
        try:
            with _ReplyInterrupts() as ctrl_c:
                respond = self.chat.regenerate if regenerate else self.chat.respond
                out = ReplyOutput()
                try:
                    respond(out.answer, lambda: ctrl_c.requested, out.think)
                finally:
                    out.end()
        except KeyboardInterrupt:
            pass   # the second Ctrl-C: Chat kept what was written and dropped the half-updated context
        except LlogosError:
            # Nothing was generated: a message too long for the context should not stay behind.
            if not regenerate and len(self.chat.messages) == n_before:
                self.chat.messages.pop()
            raise
        stream("\n")
        reply = self.chat.last
        if reply is None or reply.stop == "interrupted":
            notice("(reply interrupted)")
        if reply is not None and self.show_stats:
            notice(reply.summary())


def _need(arg: str, command: str) -> str:
    if not arg:
        raise LlogosError(f"{command} needs a file name")
    return arg
