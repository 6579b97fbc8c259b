# SPDX-License-Identifier: MIT
# redislock: `make demo` shows it, `make test` proves it.
# Targets: all demo test check bench lint torture valgrind asan docs install clean rock (and deps).

LUA_INCDIR     ?= /usr/include/lua5.4
LUAJIT_INCDIR  ?= /usr/include/luajit-2.1
HIREDIS_INCDIR ?= /usr/include
HIREDIS_LIBS   ?= -lhiredis
SSL_LIBS       ?= -lssl -lcrypto
SYS_LIBS        = -ldl   # dladdr/dlopen; part of libc since glibc 2.34
CC             ?= cc
CFLAGS         ?= -O2 -g
WARNINGS        = -std=c99 -Wall -Wextra -pedantic -Wmissing-prototypes -Wshadow \
                  -Wstrict-prototypes -Wformat=2
# CI builds with -Werror; locally a warning should not stop a demo.
ifeq ($(CI),true)
WARNINGS += -Werror
endif
ifeq ($(shell uname -s),Darwin)
SHARED = -bundle -undefined dynamic_lookup
else
SHARED = -shared
endif
MODFLAGS = -fPIC -fvisibility=hidden -pthread -I$(HIREDIS_INCDIR)
SANITIZE = -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer

SRC = csrc/rl_proto.c csrc/rl_call.c csrc/rl_script.c csrc/rl_scripts.c csrc/rl_slot.c csrc/rl_sys.c csrc/rl_sha1.c csrc/rl_tls.c csrc/rl_conn.c csrc/rl_many.c csrc/rl_renewal.c csrc/rl_watchdog.c csrc/rl_sentinel.c csrc/rl_proc.c
SRC += csrc/rl_lua.c csrc/rl_lua_call.c csrc/rl_lua_client.c csrc/rl_lua_lease.c csrc/rl_lua_reader.c csrc/rl_lua_renewal.c csrc/rl_lua_watch.c
HDR = $(wildcard csrc/*.h)

LUA54_MOD  = build/lua5.4/redislock/core.so
LUAJIT_MOD = build/luajit/redislock/core.so
ASAN_MOD   = build/asan/redislock/core.so

.PHONY: all deps demo test check bench lint torture valgrind asan docs install clean rock scripts

# The modules, and beside each the fork spec's helper (spec/05 needs it).
all: $(LUA54_MOD) $(LUAJIT_MOD) build/lua5.4/spec_fork.so build/luajit/spec_fork.so

# Each build folder holds modules for one Lua with one set of flags.
MOD_CFLAGS = $(CFLAGS)
build/lua5.4/%: MOD_INC = $(LUA_INCDIR)
build/luajit/%: MOD_INC = $(LUAJIT_INCDIR)
build/asan/%:   MOD_INC = $(LUA_INCDIR)
build/asan/%:   MOD_CFLAGS = -O1 -g $(SANITIZE)

$(LUA54_MOD) $(LUAJIT_MOD) $(ASAN_MOD): $(SRC) $(HDR)
	@mkdir -p $(@D)
	$(CC) $(MOD_CFLAGS) $(WARNINGS) $(MODFLAGS) -I$(MOD_INC) $(SHARED) -o $@ $(SRC) $(HIREDIS_LIBS) $(SSL_LIBS) $(SYS_LIBS)

# The scripts' C, from one file per script under csrc/scripts/
# (tools/gen_scripts.lua; docs/development.md, "Changing a script"). The
# output is committed, as the rockspec's builtin build runs no generator;
# make lint fails when it is not current.
SCRIPTS = $(wildcard csrc/scripts/*.lua csrc/scripts/lib/*.lua)
csrc/rl_scripts.c: $(SCRIPTS) tools/gen_scripts.lua csrc/rl_proto.h csrc/rl_ops.h
	lua5.4 tools/gen_scripts.lua

scripts: csrc/rl_scripts.c

# Test support for the fork spec, beside each module (never installed).
build/%/spec_fork.so: spec/support/fork.c
	@mkdir -p $(@D)
	$(CC) $(MOD_CFLAGS) $(WARNINGS) $(MODFLAGS) -I$(MOD_INC) $(SHARED) -o $@ $<

# The protocol core alone (no Lua, no I/O), under ASan and UBSan.
PROTO_SRC = csrc/rl_proto.c csrc/rl_call.c csrc/rl_renewal.c csrc/rl_script.c csrc/rl_scripts.c csrc/rl_slot.c csrc/rl_sys.c csrc/rl_sha1.c
build/proto_test: spec/support/proto_test.c $(PROTO_SRC) $(HDR)
	@mkdir -p $(@D)
	$(CC) -O1 -g $(SANITIZE) $(WARNINGS) -pthread -Icsrc -I$(HIREDIS_INCDIR) -o $@ $< $(PROTO_SRC) $(HIREDIS_LIBS)

build/nodlclose.so: tools/nodlclose.c
	@mkdir -p $(@D)
	$(CC) -O2 -fPIC -shared -o $@ $<

# Installs the Debian packages the build, tests and demo need (when root).
deps:
	@sh tools/deps.sh

demo: deps all
	@sh examples/demo.sh

# The busted suite under Lua 5.4 and LuaJIT, against private redis-servers;
# spec/01 also runs the protocol core's own C unit test (build/proto_test).
# spec/run.sh runs the spec files side by side (REDISLOCK_JOBS at once, both
# interpreters' together), each with its own servers; logs in build/*/logs/.
test: deps all build/lua5.4/spec_fork.so build/luajit/spec_fork.so build/proto_test
	@sh spec/run.sh lua5.4:build/lua5.4 luajit:build/luajit

# The inner loop, in under 2 minutes: the C unit test and the Lua 5.4 specs
# but the long ones (a "-- run.sh: long" line in their header: topologies,
# rock builds, restarts with a data set); make test runs everything.
check: deps $(LUA54_MOD) build/lua5.4/spec_fork.so build/proto_test
	@REDISLOCK_SKIP=long sh spec/run.sh lua5.4:build/lua5.4

# Benchmarks (not tests): bench/run.sh prints a table and a `bench ...` line per
# figure. The raw-socket floors (a lock cycle, a wake-up, contended handoffs)
# are small C programs, built with the same warnings.
bench: deps all build/bench/floor build/bench/handoff_floor build/bench/contend_floor
	@sh tools/deps.sh bench || echo "bench: without python3-redis the redis-py figures are skipped"
	@sh bench/run.sh

build/bench/floor: bench/floor.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(WARNINGS) -o $@ $<

build/bench/handoff_floor: bench/handoff_floor.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(WARNINGS) -o $@ $<

build/bench/contend_floor: bench/contend_floor.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(WARNINGS) -o $@ $<

lint: deps
	@sh tools/lint.sh

# A source rock of the release (rockspec/redislock-<version>-1.rockspec) in
# build/rock/, for `luarocks install <file>` offline (tools/rock.sh).
rock: deps
	@sh tools/rock.sh

# Fault injection (not part of make test): with_lock under SIGSTOP, CLIENT KILL,
# CLIENT PAUSE, DEBUG SLEEP, restarts, partitions, failovers, early expiry and
# CPU hogs, clock jumps, cut and lossy links, then a checker; a phase per
# topology (TORTURE_TOPOLOGY=single, sentinel, cluster, redlock or all). About
# 3.5 minutes a phase; TORTURE_SHORT=1 for 30 s a phase, TORTURE_SEED=N to replay.
torture: deps all
	@sh torture/run.sh

# The Lua 5.4 suite under valgrind (LuaJIT is left out: it needs a valgrind build).
# --fair-sched: valgrind runs one thread at a time, and the watchdog thread must
# get its turn while a spec computes.
valgrind: deps $(LUA54_MOD) build/lua5.4/spec_fork.so build/proto_test
	@REDISLOCK_WRAP="valgrind --quiet --fair-sched=yes --leak-check=full --show-leak-kinds=definite,indirect \
	  --errors-for-leak-kinds=definite,indirect --error-exitcode=99 --keep-debuginfo=yes" \
	  REDISLOCK_SLOW=1 sh spec/run.sh lua5.4:build/lua5.4

# The Lua 5.4 suite with the module built under ASan and UBSan.
asan: deps $(ASAN_MOD) build/asan/spec_fork.so build/nodlclose.so build/proto_test
	@REDISLOCK_PRELOAD="$$($(CC) -print-file-name=libasan.so) $$($(CC) -print-file-name=libubsan.so) $(CURDIR)/build/nodlclose.so" \
	  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
	  LSAN_OPTIONS=suppressions=$(CURDIR)/tools/lsan.supp:print_suppressions=0 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  sh spec/run.sh lua5.4:build/asan

# The API reference, from the doc comments of the modules config.ld names,
# into build/docs/ (spec/40 checks that it builds without a warning, and
# that every link of README.md and docs/ resolves).
docs: deps
	@ldoc .

# The rock into LuaRocks' tree, and the command's manual page beside its
# bin/ (share/man/man1, where man looks for the commands of a bin/ on PATH).
# LUAROCKS and ROCK_VARS pick another Lua or tree (spec/07: a fresh tree).
LUAROCKS = luarocks --lua-version=5.4
install:
	$(LUAROCKS) make rockspec/redislock-scm-1.rockspec $(ROCK_VARS)
	@bin="$$($(LUAROCKS) config deploy_bin_dir)" && [ -n "$$bin" ] && man1="$$(dirname "$$bin")/share/man/man1" && \
	  mkdir -p "$$man1" && cp docs/redislock.1 "$$man1/" && echo "manual page: $$man1/redislock.1"

clean:
	rm -rf build
	rm -f csrc/*.o redislock/core.so
