"""A gate's command, read strictly, and the script the agent runs for it.

A gate proves something only when every failure in it stops it, and a regex over shell text
cannot tell when one is hidden (`s\\et +e`, `false || true`, `sh -c '...'`). So a gate's
command is accepted only when it reads as this small grammar, and the agent runs what it read:

- simple commands joined into pipelines by `|`, pipelines joined by `;`, `&&` and newlines;
  `&&` runs as `;` does (the next pipeline runs only when this one succeeded, and a failed one
  fails the gate: under `set -e`, bash itself would let `false && x` go on);
- a simple command is `NAME=value` prefixes, then words: plain, single- or double-quoted, or
  backslash-escaped; then or among them the redirections `>`, `>>`, `<` to a file (with an
  optional descriptor number, `2>log`) and `N>&M` (`2>&1`);
- refused: `||`, `&` (background), `|&`, `( )`, `{ }`, `$` and backticks (any expansion, in
  double quotes too), unquoted globs (`* ? [`), `~`, a comment, here-documents and other
  redirections, a shell keyword as a command (`if`, `for`, `while`, `case`, `function`, `!`,
  `[[`, `time`, ...), a command that re-enters a shell or changes its error handling (`sh`,
  `bash` and the other shells, `eval`, `exec`, `set`, `shopt`, `trap`, `source`, `.`, `command`,
  `builtin`, `enable`, `alias`, `declare`, `typeset`), a command that hands its arguments to a
  shell (`su`, `sudo`, `doas`, `runuser`, `ssh`, `watch`, `script`, `parallel`), a shell named
  anywhere in the words of a command that runs another (`env`, `xargs`, `timeout`, `nice`,
  `nohup`, `setsid`, `stdbuf`, `ionice`, `chrt`, `taskset`, `flock`, `find`, `strace`,
  `nsenter`, `unshare`, `chroot`), `env -S` and `flock -c`, and an assignment to a variable
  that steers a shell (`BASH_ENV`, `ENV`, `SHELLOPTS`, `BASHOPTS`, `POSIXLY_CORRECT`, `IFS`).

The script is every pipeline on a line of its own, each word quoted again (so that bash reads
exactly the words read here), run under `bash -e -o pipefail`: the first pipeline that fails
(any of its commands, for pipefail) ends the gate with its status. A program the gate runs
(`python3 -m pytest`, `./check.sh`) answers for itself: its exit status is what counts.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

KEYWORDS = frozenset({"if", "then", "else", "elif", "fi", "for", "while", "until", "do", "done",
                      "case", "esac", "in", "function", "select", "time", "coproc", "!", "[[",
                      "]]", "{", "}"})
SHELL = re.compile(r"(?:ba|da|z|k|mk|a|ya|po|c|tc|r)?sh[0-9.]*|fish|busybox|pwsh")
SHELL_BUILTINS = frozenset({"eval", "exec", "set", "shopt", "trap", "source", ".", "command",
                            "builtin", "enable", "alias", "declare", "typeset"})
# programs that run a command line they read themselves (xargs: from its input)
SHELL_RUNNERS = frozenset({"su", "sudo", "doas", "runuser", "ssh", "watch", "script",
                           "parallel", "xargs"})
# every bash builtin: bash runs these itself for a name without a slash, and many read their
# arguments as shell code (`let`, `mapfile -C`, `jobs -x`, array subscripts in `printf -v`,
# `read`, `unset`, `test -v`): only these few, which run nothing, may name a gate's command
BASH_BUILTINS = frozenset({".", ":", "[", "alias", "bg", "bind", "break", "builtin", "caller",
                           "cd", "command", "compgen", "complete", "compopt", "continue",
                           "declare", "dirs", "disown", "echo", "enable", "eval", "exec", "exit",
                           "export", "false", "fc", "fg", "getopts", "hash", "help", "history",
                           "jobs", "kill", "let", "local", "logout", "mapfile", "popd", "printf",
                           "pushd", "pwd", "read", "readarray", "readonly", "return", "set",
                           "shift", "shopt", "source", "suspend", "test", "times", "trap",
                           "true", "type", "typeset", "ulimit", "umask", "unalias", "unset",
                           "wait"})
PLAIN_BUILTINS = frozenset({"cd", "echo", "true", "false", "pwd", "printf"})
WRAPPERS = frozenset({"env", "time", "timeout", "nice", "nohup", "setsid", "stdbuf", "ionice",
                      "chrt", "taskset", "flock", "find", "strace", "nsenter", "unshare", "chroot"})
SHELL_VARIABLES = frozenset({"BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "POSIXLY_CORRECT",
                             "IFS"})
ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=")
GRAMMAR = ("a gate's command is simple commands joined by `;`, `&&`, `|` and newlines, run as "
           "read under `set -e` and pipefail (docs/operator.md, gates)")


class Token(NamedTuple):
    kind: str  # "word", "op" (`;`, `&&`, `|` or a line break) or "redirect"
    value: str
    quoted_at: int | None = None  # a word's first quoted character
    dup: bool = False  # a redirection to a descriptor (`2>&1`), not to a file


class Unreadable(ValueError):
    """The command is not of the strict grammar: why, in a few words."""


@dataclass(frozen=True)
class Command:
    assignments: tuple[tuple[str, str], ...]
    words: tuple[str, ...]
    redirections: tuple[tuple[str, str | None], ...]  # (operator, file) or ("2>&1", None)

    def text(self) -> str:
        parts = [f"{name}={shlex.quote(value)}" for name, value in self.assignments]
        parts += [shlex.quote(w) for w in self.words]
        parts += [op + ("" if target is None else shlex.quote(target))
                  for op, target in self.redirections]
        return " ".join(parts)


@dataclass(frozen=True)
class Script:
    pipelines: tuple[tuple[Command, ...], ...]

    def text(self) -> str:
        """What bash runs: one pipeline a line, every word quoted again."""
        return "\n".join(" | ".join(c.text() for c in p) for p in self.pipelines) + "\n"


def read_gate(command: str) -> Script:
    """The command as the strict grammar reads it; Unreadable when it does not."""
    pipelines: list[tuple[Command, ...]] = []
    current: list[Command] = []
    cmd = _Builder()
    pending: str | None = None  # `&&` or `|`: a command must follow
    for kind, value, quoted_at, dup in _tokens(command):
        if kind == "word":
            cmd.word(value, quoted_at)
            continue
        if kind == "redirect":
            cmd.redirect(value, dup)
            continue
        if cmd.wants_target:
            raise Unreadable(f"a redirection with no file before {value!r}")
        if cmd.empty:
            if value == "\n" and (pending is not None or not current):
                continue  # a blank line, or a line break after `&&` / `|`
            raise Unreadable(f"{_shown(value)} with no command before it")
        current.append(cmd.build())
        cmd = _Builder()
        if value == "|":
            pending = "|"
            continue
        pipelines.append(tuple(current))
        current = []
        pending = "&&" if value == "&&" else None
    if cmd.wants_target:
        raise Unreadable("a redirection with no file")
    if not cmd.empty:
        current.append(cmd.build())
        pipelines.append(tuple(current))
    elif pending is not None:
        raise Unreadable(f"it ends with {pending!r}")
    if not pipelines:
        raise Unreadable("no command")
    return Script(tuple(pipelines))


def _shown(op: str) -> str:
    return "a line break" if op == "\n" else repr(op)


@dataclass
class _Builder:
    assignments: list[tuple[str, str]] = field(default_factory=list)
    words: list[str] = field(default_factory=list)
    redirections: list[tuple[str, str | None]] = field(default_factory=list)
    wants_target: bool = False

    @property
    def empty(self) -> bool:
        return not (self.assignments or self.words or self.redirections)

    def word(self, text: str, quoted_at: int | None) -> None:
        if self.wants_target:
            self.redirections[-1] = (self.redirections[-1][0], text)
            self.wants_target = False
            return
        m = ASSIGNMENT.match(text)
        if not self.words and m and (quoted_at is None or quoted_at >= m.end()):
            if m.group(1) in SHELL_VARIABLES or m.group(1).startswith("BASH_"):
                raise Unreadable(f"an assignment to {m.group(1)}, which steers the shell")
            self.assignments.append((m.group(1), text[m.end():]))
            return
        self.words.append(text)

    def redirect(self, op: str, dup: bool) -> None:
        self.redirections.append((op, None))
        self.wants_target = not dup

    def build(self) -> Command:
        if self.words:
            _check_program(self.words)
        return Command(tuple(self.assignments), tuple(self.words), tuple(self.redirections))


def _check_program(words: list[str]) -> None:
    name = words[0]
    base = name.rsplit("/", 1)[-1]
    if name in KEYWORDS:
        raise Unreadable(f"the shell keyword {name!r}")
    if "=" in name:
        raise Unreadable(f"a command named {name!r} (quoted, it would be read as an assignment)")
    if _runs_shell(base):
        raise Unreadable(f"{name!r} re-enters a shell, or changes its error handling")
    if "/" not in name and name in BASH_BUILTINS and (
            name not in PLAIN_BUILTINS
            or (name == "printf" and any(w.startswith("-") for w in words[1:2]))):
        raise Unreadable(f"the shell builtin {name!r} (of bash's builtins a gate may name only "
                         f"{', '.join(sorted(PLAIN_BUILTINS))}, and printf without options)")
    if base not in WRAPPERS:
        return
    for w in words[1:]:
        if _runs_shell(w.rsplit("/", 1)[-1]):
            raise Unreadable(f"{name!r} runs {w!r}, which re-enters a shell or changes its "
                             "error handling")
        if base == "env" and (w.startswith("--split-string")
                              or (w.startswith("-") and not w.startswith("--") and "S" in w)):
            raise Unreadable("`env -S` splits its argument like a shell")
        if base == "flock" and (w in ("-c", "--command") or w.startswith("--command=")):
            raise Unreadable("`flock -c` runs its argument in a shell")


def _runs_shell(base: str) -> bool:
    return bool(SHELL.fullmatch(base)) or base in SHELL_BUILTINS or base in SHELL_RUNNERS


def _tokens(text: str) -> list[Token]:
    """The command's words, operators and redirections, as bash would split it."""
    return _Tokenizer(text).tokens()


# characters refused wherever they stand outside quotes, and why
REFUSED = {**dict.fromkeys("()", "a subshell '( )'"), **dict.fromkeys("{}", "a brace '{ }'"),
           **{c: f"an expansion ({c!r})" for c in "$`"},
           **{c: f"an unquoted {c!r} (a glob or a home directory)" for c in "*?[~"}}


class _Tokenizer:
    """One pass over a command: each character outside quotes is looked up in STEPS (a quote,
    a blank, an operator, a redirection), or is refused, or is part of a plain word."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.i = 0
        self.out: list[Token] = []
        self.word: list[str] | None = None  # the word being read, if any
        self.quoted_at: int | None = None

    def tokens(self) -> list[Token]:
        while self.i < len(self.text):
            c = self.text[self.i]
            STEPS.get(c, _Tokenizer.other)(self, c)
        self.close()
        return self.out

    def close(self) -> None:
        if self.word is not None:
            self.out.append(Token("word", "".join(self.word), self.quoted_at))
        self.word, self.quoted_at = None, None

    def start(self, quoted: bool) -> list[str]:
        if self.word is None:
            self.word = []
        if quoted and self.quoted_at is None:
            self.quoted_at = len(self.word)
        return self.word

    def backslash(self, c: str) -> None:
        if self.i + 1 >= len(self.text):
            raise Unreadable("a backslash at the end")
        if self.text[self.i + 1] != "\n":  # a backslash-newline joins two lines
            self.start(True).append(self.text[self.i + 1])
        self.i += 2

    def single_quoted(self, c: str) -> None:
        end = self.text.find("'", self.i + 1)
        if end < 0:
            raise Unreadable("an unterminated single quote")
        self.start(True).extend(self.text[self.i + 1:end])
        self.i = end + 1

    def double_quoted(self, c: str) -> None:
        self.i = _double_quoted(self.text, self.i + 1, self.start(True))

    def blank(self, c: str) -> None:
        self.close()
        self.i += 1

    def separator(self, c: str) -> None:
        self.close()
        if self.text.startswith(";;", self.i):
            raise Unreadable("';;'")
        self.out.append(Token("op", c))
        self.i += 1

    def ampersand(self, c: str) -> None:
        self.close()
        if not self.text.startswith("&&", self.i):
            raise Unreadable("'&' (a command in the background, or '&>')")
        self.out.append(Token("op", "&&"))
        self.i += 2

    def pipe(self, c: str) -> None:
        self.close()
        if self.text.startswith(("||", "|&"), self.i):
            raise Unreadable(repr(self.text[self.i:self.i + 2]))
        self.out.append(Token("op", "|"))
        self.i += 1

    def redirection(self, c: str) -> None:
        fd = ""  # an unquoted number right before it is its descriptor (`2>log`)
        if self.word is not None and self.quoted_at is None and "".join(self.word).isdigit():
            fd, self.word = "".join(self.word), None
        self.close()
        self.i, op, dup = _redirection(self.text, self.i)
        self.out.append(Token("redirect", fd + op, dup=dup))

    def other(self, c: str) -> None:
        if c in REFUSED:
            raise Unreadable(REFUSED[c])
        if c == "#" and self.word is None:
            raise Unreadable("a comment")
        if c < " " or c == "\x7f":
            raise Unreadable(f"the control character {c!r}")
        self.start(False).append(c)
        self.i += 1


STEPS: dict[str, Callable[[_Tokenizer, str], None]] = {
    "\\": _Tokenizer.backslash, "'": _Tokenizer.single_quoted, '"': _Tokenizer.double_quoted,
    " ": _Tokenizer.blank, "\t": _Tokenizer.blank, ";": _Tokenizer.separator,
    "\n": _Tokenizer.separator, "&": _Tokenizer.ampersand, "|": _Tokenizer.pipe,
    "<": _Tokenizer.redirection, ">": _Tokenizer.redirection,
}


def _double_quoted(text: str, i: int, word: list[str]) -> int:
    """Read a double-quoted string's body into `word`; the index after its closing quote."""
    while i < len(text):
        c = text[i]
        if c == '"':
            return i + 1
        if c in "$`":
            raise Unreadable(f"an expansion ({c!r}) in double quotes")
        if c == "\\" and i + 1 < len(text) and text[i + 1] in '$`"\\\n':
            if text[i + 1] != "\n":
                word.append(text[i + 1])
            i += 2
            continue
        word.append(c)
        i += 1
    raise Unreadable("an unterminated double quote")


def _redirection(text: str, i: int) -> tuple[int, str, bool]:
    """(index after it, operator, whether it duplicates a descriptor) of `>`, `>>`, `<` or
    `>&N` at `i`; Unreadable for any other."""
    for op in (">>", ">", "<"):
        if not text.startswith(op, i):
            continue
        after = text[i + len(op):i + len(op) + 1]
        if op == ">" and after == "&":
            m = re.match(r"\d+", text[i + 2:])
            if m is None:
                break
            return i + 2 + m.end(), ">&" + m.group(), True
        if after in ("<", ">", "&", "|", "("):
            break
        return i + len(op), op, False
    raise Unreadable(f"the redirection {text[i:i + 3]!r} (only >, >>, < to a file and N>&M)")
