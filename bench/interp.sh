# SPDX-License-Identifier: MIT
# Sourced by bench/callgrind.sh and bench/syscalls.sh, which count what a
# process of each interpreter does.

# in_checkout LUA CMD...: runs CMD with the Lua paths set to this checkout's
# lua/ and build/LUA/ (LUA: lua5.4 or luajit).
in_checkout() {
  checkout_lua=$1
  shift
  LUA_PATH="$PWD/lua/?.lua;;" LUA_PATH_5_4="$PWD/lua/?.lua;;" \
    LUA_CPATH="$PWD/build/$checkout_lua/?.so;;" LUA_CPATH_5_4="$PWD/build/$checkout_lua/?.so;;" "$@"
}

# interpreter LUA: sets suffix ("" or "/luajit", for figure names) and name
# ("Lua 5.4", "LuaJIT"); exits 2 when LUA is unknown or not installed.
interpreter() {
  case $1 in
  lua5.4) suffix="" name="Lua 5.4" ;;
  luajit) suffix="/luajit" name="LuaJIT" ;;
  *) echo "bench: unknown interpreter $1 (lua5.4, luajit)" >&2; exit 2 ;;
  esac
  command -v "$1" >/dev/null || { echo "bench: $1 not found" >&2; exit 2; }
}
