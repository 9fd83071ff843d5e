
set -e
dest=$1 sums=$2
rec="${dest%/releases/*}/releases.staged/${dest##*/}"
mkdir -p "${rec%/*}" && : > "$rec.new" && mv -f "$rec.new" "$rec"
cd "$dest"
if ! out=$(printf '%s' "$sums" | sha256sum -c --quiet - 2>&1); then
  printf '%s\n' "$out" | grep FAILED | sed "s|^|$dest/|" >&2
  echo "release files on the box differ from the release's digests" >&2
  exit 1
fi
