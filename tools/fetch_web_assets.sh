#!/usr/bin/env bash
# Bundles mermaid into the site so diagrams render with no network at view time.
# Fetched once from the npm registry at install time, checked against a pinned hash.
set -euo pipefail

version=11.12.0
sha256=93492e4d609be83653a41c435f4cbd7e74419f7fa6b4fc90a8c983195f64af82
dest=docs/assets/vendor/mermaid.min.js

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "mermaid@$version" >/dev/null 2>&1)
# sha256sum on Linux; macOS has shasum (Perl) instead
if command -v sha256sum >/dev/null; then check=(sha256sum); else check=(shasum -a 256); fi
echo "$sha256  $tmp/mermaid-$version.tgz" | "${check[@]}" --check --quiet
tar -xzf "$tmp/mermaid-$version.tgz" -C "$tmp" package/dist/mermaid.min.js
mkdir -p "$(dirname "$dest")"
mv "$tmp/package/dist/mermaid.min.js" "$dest"
echo "bundled mermaid $version -> $dest"
