#!/bin/sh
# SPDX-License-Identifier: MIT
# make rock: packs the release rockspec (rockspec/redislock-<version>-1.rockspec,
# the version of csrc/rl_version.h) and its source archive into a source rock,
# build/rock/redislock-<version>-1.src.rock (ROCK_DIR to put it elsewhere):
# what `luarocks pack` makes of a rockspec, without fetching the archive. The
# archive is `git archive` of the tag v<version> when it exists, else of HEAD
# (the tree that will be tagged): committed files only. Install it with
#   luarocks --lua-version=5.4 install build/rock/redislock-<version>-1.src.rock
set -eu
cd "$(dirname "$0")/.."
version=$(sed -n 's/^#define RL_VERSION "\(.*\)"$/\1/p' csrc/rl_version.h)
spec=rockspec/redislock-$version-1.rockspec
[ -f "$spec" ] || { echo "rock: no $spec for version $version" >&2; exit 1; }
out=${ROCK_DIR:-build/rock}
tree=HEAD
if git rev-parse -q --verify "refs/tags/v$version" >/dev/null; then tree=v$version; fi
# The archive's name is the last part of the rockspec's source.url, its
# folder source.dir: luarocks looks for both inside the rock.
url=$(sed -n 's/^ *url = "\(.*\)",$/\1/p' "$spec" | head -1)
dir=$(sed -n 's/^ *dir = "\(.*\)",$/\1/p' "$spec" | head -1)
archive=${url##*/}
[ -n "$archive" ] && [ -n "$dir" ] || { echo "rock: $spec needs source.url and source.dir" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git archive --format=tar.gz --prefix="$dir/" -o "$tmp/$archive" "$tree"
cp "$spec" "$tmp/"
rock=redislock-$version-1.src.rock
(cd "$tmp" && zip -q -X "$rock" "redislock-$version-1.rockspec" "$archive")
mkdir -p "$out"
mv "$tmp/$rock" "$out/$rock"
echo "$out/$rock (from $tree)"
