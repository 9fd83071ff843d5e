"""A gate's command is read strictly, and what the agent runs is what was read: pipelines of
plain words, one a line, every word quoted again; anything the reader cannot be sure of is
refused (docs/operator.md, gates)."""

from __future__ import annotations

import subprocess

import pytest

from agent.job.gate_command import Unreadable, read_gate

# the gate commands of the project's docs, examples and tests, and what bash is given for each
READ = {
    "python3 -m pytest -q parity": "python3 -m pytest -q parity\n",
    "python3 parity.py": "python3 parity.py\n",
    "cd tests && python3 -m pytest -q": "cd tests\npython3 -m pytest -q\n",
    "python3 -m pytest -q t | tee t.log": "python3 -m pytest -q t | tee t.log\n",
    "python3 -c \"print('12 skipped in 0.51s')\"":
        "python3 -c 'print('\"'\"'12 skipped in 0.51s'\"'\"')'\n",
    "touch gating; sleep 600": "touch gating\nsleep 600\n",
    "setsid -f sleep 6017 </dev/null >/dev/null 2>&1; python3 parity.py":
        "setsid -f sleep 6017 </dev/null >/dev/null 2>&1\npython3 parity.py\n",
    "CUDA_VISIBLE_DEVICES=0 pytest -q x 2>err.log":
        "CUDA_VISIBLE_DEVICES=0 pytest -q x 2>err.log\n",
    'A="b c" pytest': "A='b c' pytest\n",
    "echo a\\;b 'c; d' \"e || f\"": "echo 'a;b' 'c; d' 'e || f'\n",
    "pytest a &&\n  pytest b\n\n": "pytest a\npytest b\n",
    "echo 'if' then": "echo if then\n",
    "printf '%s\\n' done": "printf '%s\\n' done\n",
}
REFUSED = {
    "s\\et +e; false": "'set' re-enters a shell, or changes its error handling",
    "shopt -uo errexit": "'shopt'",
    "s=set; $s +e": "an expansion ('$')",
    'echo "$HOME"': "an expansion ('$') in double quotes",
    "echo `id`": "an expansion ('`')",
    "false || true": "'||'",
    "pytest &": "'&'",
    "pytest &> log": "'&'",
    "pytest |& tee log": "'|&'",
    "(pytest)": "a subshell",
    "{ pytest; }": "a brace",
    "if false; then :; fi": "the shell keyword 'if'",
    "! false": "the shell keyword '!'",
    "time false": "the shell keyword 'time'",
    "sh -c 'false; true'": "'sh'",
    "/usr/bin/bash x.sh": "'/usr/bin/bash'",
    "busybox sh -c false": "'busybox'",
    "env X=1 dash -c false": "'env' runs 'dash'",
    "xargs -a list sh": "'xargs'",
    "echo \"bash -c 'false || true'\" | xargs env": "'xargs'",
    "jobs -x python3 t.py": "the shell builtin 'jobs'",
    "let 'a[$(false)0]=1'": "the shell builtin 'let'",
    "mapfile -c 1 -C 'false; :' arr < in.txt": "the shell builtin 'mapfile'",
    "printf -v 'a[$(false)0]' x": "the shell builtin 'printf'",
    "unset 'a[$(false)0]'": "the shell builtin 'unset'",
    "echo x | read -r 'a[$(false)0]'": "the shell builtin 'read'",
    "test -v 'a[$(false)0]'": "the shell builtin 'test'",
    "compgen -W '$(false)'": "the shell builtin 'compgen'",
    "hash -p /bin/true false": "the shell builtin 'hash'",
    "/usr/bin/time bash -c false": "'/usr/bin/time' runs 'bash'",
    "env -S 'python3 x'": "`env -S`",
    "env -iS 'python3 x'": "`env -S`",
    "flock -c 'false' lock": "`flock -c`",
    "sudo false": "'sudo'",
    "eval false": "'eval'",
    ". ./env.sh": "'.'",
    "exec pytest": "'exec'",
    "BASH_ENV=x python3 t.py": "BASH_ENV",
    "'A=b' pytest": "read as an assignment",
    "pytest tests/*.py": "an unquoted '*'",
    "cat ~/x": "an unquoted '~'",
    "pytest # quick": "a comment",
    "cat <<EOF": "the redirection",
    "cat <(ls)": "the redirection",
    "pytest > ": "a redirection with no file",
    "pytest >| x": "the redirection",
    "a; ; b": "';' with no command before it",
    "a &&": "it ends with '&&'",
    "| a": "'|' with no command before it",
    "echo 'open": "an unterminated single quote",
    "echo \"open": "an unterminated double quote",
    "echo a\\": "a backslash at the end",
    "echo a\rb": "the control character",
    "": "no command",
    "\n\n": "no command",
}


@pytest.mark.parametrize("command", sorted(READ))
def test_a_strict_command_is_read_into_the_script_bash_runs(command: str) -> None:
    assert read_gate(command).text() == READ[command]


@pytest.mark.parametrize("command", sorted(REFUSED))
def test_a_command_the_reader_cannot_be_sure_of_is_refused(command: str) -> None:
    with pytest.raises(Unreadable) as e:
        read_gate(command)
    assert REFUSED[command] in str(e.value), str(e.value)


def test_bash_runs_the_words_that_were_read() -> None:
    script = read_gate("printf '%s|' 'a b' c\\ d \"e'f\" && printf '\\n'").text()
    done = subprocess.run(["/bin/bash", "-e", "-o", "pipefail", "-c", script],
                          capture_output=True, text=True, check=True)
    assert done.stdout == "a b|c d|e'f|\n"
