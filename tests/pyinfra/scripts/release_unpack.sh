
set -e
dest=$1 tarball=$2 sums=$3
rec="${dest%/releases/*}/releases.staged/${dest##*/}"
mkdir -p "${rec%/*}" && : > "$rec.new" && mv -f "$rec.new" "$rec"
tmp="$dest.partial"
rm -rf "$tmp" && mkdir -p "$tmp"
tar -xf "$tarball" -C "$tmp"
cd "$tmp" && printf '%s' "$sums" | sha256sum -c --quiet -
rm -rf "$dest" && mv "$tmp" "$dest" && rm -f "$tarball"
