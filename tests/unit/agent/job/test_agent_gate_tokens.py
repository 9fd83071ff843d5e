"""The tokenizer under a gate's command: how it splits each of many commands into words,
operators and redirections (a token is (kind, value, quoted_at, dup), quoted_at and dup left
out where None and False), or the few words with which it refuses one. The expected values are
the ones the tokenizer gave before it was written as a table of character classes."""

from __future__ import annotations

import pytest

from agent.job.gate_command import Token, Unreadable, _tokens

CASES: list[tuple[str, list[tuple[object, ...]] | str]] = [
    ('', []),
    (' ', []),
    ('a', [('word', 'a')]),
    ('echo hi', [('word', 'echo'), ('word', 'hi')]),
    ('  echo\thi  ', [('word', 'echo'), ('word', 'hi')]),
    ('a;b', [('word', 'a'), ('op', ';'), ('word', 'b')]),
    ('a ; b', [('word', 'a'), ('op', ';'), ('word', 'b')]),
    ('a\nb', [('word', 'a'), ('op', '\n'), ('word', 'b')]),
    ('a&&b', [('word', 'a'), ('op', '&&'), ('word', 'b')]),
    ('a && b', [('word', 'a'), ('op', '&&'), ('word', 'b')]),
    ('a|b', [('word', 'a'), ('op', '|'), ('word', 'b')]),
    ('a | b', [('word', 'a'), ('op', '|'), ('word', 'b')]),
    ('a;;b', "';;'"),
    ('a&b', "'&' (a command in the background, or '&>')"),
    ('a &', "'&' (a command in the background, or '&>')"),
    ('a&>f', "'&' (a command in the background, or '&>')"),
    ('a||b', "'||'"),
    ('a|&b', "'|&'"),
    ('a>f', [('word', 'a'), ('redirect', '>'), ('word', 'f')]),
    ('a > f', [('word', 'a'), ('redirect', '>'), ('word', 'f')]),
    ('a>>f', [('word', 'a'), ('redirect', '>>'), ('word', 'f')]),
    ('a<f', [('word', 'a'), ('redirect', '<'), ('word', 'f')]),
    ('2>f', [('redirect', '2>'), ('word', 'f')]),
    ('2>>log', [('redirect', '2>>'), ('word', 'log')]),
    ('2>&1', [('redirect', '2>&1', None, True)]),
    ('a 2>&1', [('word', 'a'), ('redirect', '2>&1', None, True)]),
    ('a >&2', [('word', 'a'), ('redirect', '>&2', None, True)]),
    ('a 10>f', [('word', 'a'), ('redirect', '10>'), ('word', 'f')]),
    ('a x2>f', [('word', 'a'), ('word', 'x2'), ('redirect', '>'), ('word', 'f')]),
    ("'2'>f", [('word', '2', 0), ('redirect', '>'), ('word', 'f')]),
    ("2'x'>f", [('word', '2x', 1), ('redirect', '>'), ('word', 'f')]),
    ('a>&x', "the redirection '>&x' (only >, >>, < to a file and N>&M)"),
    ('a<<EOF', "the redirection '<<E' (only >, >>, < to a file and N>&M)"),
    ('a<>f', "the redirection '<>f' (only >, >>, < to a file and N>&M)"),
    ('a>|f', "the redirection '>|f' (only >, >>, < to a file and N>&M)"),
    ('a>(f)', "the redirection '>(f' (only >, >>, < to a file and N>&M)"),
    ('a<(f)', "the redirection '<(f' (only >, >>, < to a file and N>&M)"),
    ('a>&', "the redirection '>&' (only >, >>, < to a file and N>&M)"),
    ('a\\', 'a backslash at the end'),
    ('a\\ b', [('word', 'a b', 1)]),
    ('a\\\nb', [('word', 'ab')]),
    ('\\\n', []),
    ("'a b'", [('word', 'a b', 0)]),
    ("''", [('word', '', 0)]),
    ("'a", 'an unterminated single quote'),
    ("x'a'", [('word', 'xa', 1)]),
    ('"a b"', [('word', 'a b', 0)]),
    ('""', [('word', '', 0)]),
    ('"a', 'an unterminated double quote'),
    ('"a$b"', "an expansion ('$') in double quotes"),
    ('"a`b"', "an expansion ('`') in double quotes"),
    ('"a\\$b"', [('word', 'a$b', 0)]),
    ('"a\\"b"', [('word', 'a"b', 0)]),
    ('"a\\\\b"', [('word', 'a\\b', 0)]),
    ('"a\\nb"', [('word', 'a\\nb', 0)]),
    ('"a\\\nb"', [('word', 'ab', 0)]),
    ('a"b"c', [('word', 'abc', 1)]),
    ('a\'b\'c"d"', [('word', 'abcd', 1)]),
    ('(a)', "a subshell '( )'"),
    ('a)', "a subshell '( )'"),
    ('{ a; }', "a brace '{ }'"),
    ('a}', "a brace '{ }'"),
    ('$x', "an expansion ('$')"),
    ('a$x', "an expansion ('$')"),
    ('`a`', "an expansion ('`')"),
    ('a*', "an unquoted '*' (a glob or a home directory)"),
    ('a?', "an unquoted '?' (a glob or a home directory)"),
    ('[a', "an unquoted '[' (a glob or a home directory)"),
    ('~', "an unquoted '~' (a glob or a home directory)"),
    ('a~', "an unquoted '~' (a glob or a home directory)"),
    ('#c', 'a comment'),
    ('a #c', 'a comment'),
    ('a#c', [('word', 'a#c')]),
    ("'#'", [('word', '#', 0)]),
    ('a\x01b', "the control character '\\x01'"),
    ('a\x7fb', "the control character '\\x7f'"),
    ('a\rb', "the control character '\\r'"),
    ('A=1 b', [('word', 'A=1'), ('word', 'b')]),
    ("A='x y' b", [('word', 'A=x y', 2), ('word', 'b')]),
    ("'A'=1", [('word', 'A=1', 0)]),
    ('é ü', [('word', 'é'), ('word', 'ü')]),
    ('a;\nb', [('word', 'a'), ('op', ';'), ('op', '\n'), ('word', 'b')]),
    ('a|\nb', [('word', 'a'), ('op', '|'), ('op', '\n'), ('word', 'b')]),
    ('a&&\nb', [('word', 'a'), ('op', '&&'), ('op', '\n'), ('word', 'b')]),
    ('python3 -m pytest -q tests/', [
        ('word', 'python3'), ('word', '-m'), ('word', 'pytest'), ('word', '-q'),
        ('word', 'tests/'),
    ]),
    ('./check.sh 2>&1 | tee log', [
        ('word', './check.sh'), ('redirect', '2>&1', None, True), ('op', '|'), ('word', 'tee'),
        ('word', 'log'),
    ]),
    ('x=1', [('word', 'x=1')]),
    ('a\tb\tc', [('word', 'a'), ('word', 'b'), ('word', 'c')]),
    ('a ;b;', [('word', 'a'), ('op', ';'), ('word', 'b'), ('op', ';')]),
    ('\n\n', [('op', '\n'), ('op', '\n')]),
    ('a 1>f2 3<g', [
        ('word', 'a'), ('redirect', '1>'), ('word', 'f2'), ('redirect', '3<'), ('word', 'g'),
    ]),
    ('\'a\'\\ b"c"', [('word', 'a bc', 0)]),
    ('a\\#b', [('word', 'a#b', 1)]),
    ('a]', [('word', 'a]')]),
    ('a!b', [('word', 'a!b')]),
    ('! a', [('word', '!'), ('word', 'a')]),
    ('a=b=c d', [('word', 'a=b=c'), ('word', 'd')]),
    ('echo \'x\'"y"z', [('word', 'echo'), ('word', 'xyz', 0)]),
    ('a >', [('word', 'a'), ('redirect', '>')]),
    ('a > > b', [('word', 'a'), ('redirect', '>'), ('redirect', '>'), ('word', 'b')]),
    ('a 2>&1 >f', [
        ('word', 'a'), ('redirect', '2>&1', None, True), ('redirect', '>'), ('word', 'f'),
    ]),
]


@pytest.mark.parametrize(("command", "expected"), CASES)
def test_the_tokenizer_splits_or_refuses_as_it_did(command: str,
                                                  expected: list[tuple[object, ...]] | str
                                                  ) -> None:
    if isinstance(expected, str):
        with pytest.raises(Unreadable) as e:
            _tokens(command)
        assert str(e.value) == expected
    else:
        assert _tokens(command) == [Token(*t) for t in expected]  # type: ignore[arg-type]
