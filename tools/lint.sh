#!/bin/sh
# SPDX-License-Identifier: MIT
# make lint: one version string (csrc/rl_version.h) agreed by every rockspec,
# luacheck over the Lua code, and a -Werror build of the C core.
set -eu
cd "$(dirname "$0")/.."
status=0

version=$(sed -n 's/^#define RL_VERSION "\(.*\)"$/\1/p' csrc/rl_version.h)
[ -n "$version" ] || { echo "lint: no RL_VERSION in csrc/rl_version.h"; exit 1; }
for spec in rockspec/redislock-*.rockspec; do
  name=$(basename "$spec" .rockspec)
  file_version=${name#redislock-}
  declared=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$spec")
  if [ "$declared" != "$file_version" ]; then
    echo "lint: $spec declares version \"$declared\", its name says \"$file_version\""
    status=1
  fi
  case $file_version in
    scm-*) ;;
    "$version"-*) ;;
    *) echo "lint: $spec is for $file_version, but csrc/rl_version.h says $version"; status=1 ;;
  esac
done
if grep -n '_VERSION *= *"' lua/*.lua lua/*/*.lua 2>/dev/null; then
  echo "lint: the Lua code must take its version from redislock.core, not spell it"
  status=1
fi

# Every Lua file under lua/ is installed by every rockspec, as the module its
# path names (lua/redislock/x.lua is redislock.x): a file left out would
# fail a user's require, not the build.
for spec in rockspec/redislock-*.rockspec; do
  for file in $(find lua -name '*.lua' | sort); do
    module=$(echo "${file#lua/}" | sed 's/\.lua$//; s#/#.#g')
    if ! grep -q "^ *\(\[\"$module\"\]\|$module\) = \"$file\"," "$spec"; then
      echo "lint: $spec does not install $file as $module"
      status=1
    fi
  done
done

# Every rockspec builds the C files the Makefile does, and installs the command.
make_src=$(sed -n 's/^SRC +\{0,1\}= //p' Makefile | tr ' ' '\n' | sort | tr '\n' ' ')
for spec in rockspec/redislock-*.rockspec; do
  spec_src=$(sed -n '/sources = {/,/}/p' "$spec" | grep -o '"csrc/[^"]*"' | tr -d '"' | sort | tr '\n' ' ')
  if [ "$spec_src" != "$make_src" ]; then
    echo "lint: $spec builds $spec_src; the Makefile builds $make_src"
    status=1
  fi
  grep -q 'bin = { redislock = "bin/redislock" }' "$spec" || { echo "lint: $spec does not install bin/redislock"; status=1; }
done
# The release's contents are in the CHANGELOG.
grep -q "^## $version " CHANGELOG.md || { echo "lint: CHANGELOG.md has no section for $version"; status=1; }
grep -q "^\.TH REDISLOCK 1 [0-9-]* \"redislock $version\"" docs/redislock.1 \
  || { echo "lint: docs/redislock.1's .TH line does not say redislock $version"; status=1; }

luacheck -q --no-color lua spec examples bench torture bin/redislock tools || status=1

# The Redis scripts: csrc/rl_scripts.c is what csrc/scripts/ makes, and
# luacheck reads each script as Redis gets it (its fragments in place).
rm -rf build/scripts && mkdir -p build/scripts
lua5.4 tools/gen_scripts.lua --check --lint build/scripts || status=1
luacheck -q --no-color build/scripts || status=1

# The C core under -Werror, for both Lua headers (syntax only: writes nothing).
for inc in "${LUA_INCDIR:-/usr/include/lua5.4}" "${LUAJIT_INCDIR:-/usr/include/luajit-2.1}"; do
  ${CC:-cc} -fsyntax-only -std=c99 -Wall -Wextra -pedantic -Wmissing-prototypes -Wshadow \
    -Wstrict-prototypes -Wformat=2 -Werror -I"$inc" csrc/*.c || status=1
done

[ $status = 0 ] && echo "lint: ok (version $version)"
exit $status
