
set -e
root=$1 tarball=$2 sha=$3
mkdir -p "$root"
rm -rf "$root/.unpack" && mkdir "$root/.unpack"
tar -xzf "$tarball" -C "$root/.unpack"
if [ ! -x "$root/venv/bin/python" ]; then
  python3 -m venv --without-pip "$root/venv" ||
    { echo "python3 -m venv failed on this box" >&2; exit 1; }
fi
"$root/venv/bin/python" - "$root" "$root"/.unpack/wheels/*.whl <<'PY'
import compileall, os, sys, sysconfig, zipfile
site = sysconfig.get_paths()["purelib"]
for wheel in sys.argv[2:]:
    zipfile.ZipFile(wheel).extractall(site)
with open(os.path.join(site, "fleet-agent.pth"), "w") as f:
    f.write(sys.argv[1] + "\n")
    f.write("import sys; sys.dont_write_bytecode = True\n")
compileall.compile_dir(site, quiet=2)
PY
mkdir -p "$root/in"
cp -a "$root"/.unpack/in/. "$root/in/" 2>/dev/null || true
rm -rf "$root/agent.old"
[ -d "$root/agent" ] && mv "$root/agent" "$root/agent.old"
mv "$root/.unpack/agent" "$root/agent"
"$root/venv/bin/python" -m compileall -q "$root/agent" >/dev/null
echo "$sha" > "$root/agent/BUNDLE.tmp" && mv "$root/agent/BUNDLE.tmp" "$root/agent/BUNDLE"
rm -rf "$root/.unpack" "$root/agent.old" "$tarball"
