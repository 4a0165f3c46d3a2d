#!/bin/bash
# bench/int/prep_round.sh [--fixtures] NAME[=BRANCH] ...: the integrator's device-round bundles.
# Builds each branch's last commit (NAME alone: branch NAME; main first, the others start from its
# objects) in $INT_DIR/NAME (default ../int beside the checkout: a persistent worktree with its own build-dev/: sm_90a code only, so that the xz of the
# bundle, whose dictionary spans several binaries, stays small) and pack what the GPU machine needs into
# .dev/int/NAME.tar.xz (the tree + build/laststand, .so, tests/). --fixtures also packs
# ../shared/fixtures/models once (.dev/int/fixtures.tar; carry names the files a call takes, so other
# bundles and the fixtures stay). Builds run one after another (2 cores).
set -u
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1
ROOT=$(pwd); INT=${INT_DIR:-$(dirname "$ROOT")/int}
FIX=0
[ "${1:-}" = --fixtures ] && { FIX=1; shift; }
mkdir -p .dev/int
for spec in "$@"; do rm -f ".dev/int/${spec%%=*}.tar.xz"; done  # only the bundles rebuilt now
for spec in "$@"; do
    name=${spec%%=*}; br=${spec#*=}
    w=$INT/$name
    if [ ! -d "$w" ]; then
        git worktree add -q --detach "$w" main || exit 1
        # a branch starts from main's objects (its own changed sources are newer, so they rebuild)
        [ "$name" != main ] && [ -d "$INT/main/build-dev" ] && cp -a "$INT/main/build-dev" "$w/" &&
            find "$w/build-dev" -exec touch {} +
    fi
    git -C "$w" checkout -q --detach "$br" || { echo "prep: $name: checkout $br failed"; continue; }
    echo "prep: $name at $(git -C "$w" log --oneline -1 | cut -c1-90)"
    t0=$SECONDS
    tg=all
    if [ "$name" != main ]; then  # a helper: the binary, the .so files and the unit tests its scripts name
        tg="build-dev/laststand build-dev/libmicrohttpd.so.12 build-dev/libcmocka.so.0"
        for t in $(grep -oh 'test_[a-z0-9_]*' "$w"/bench/device/$name*.sh "$w"/bench/device/$name*.py 2>/dev/null | sort -u); do
            [ -f "$w/tests/unit/$t.c" ] && tg="$tg build-dev/tests/$t"
        done
    fi
    if ! make -C "$w" -j2 BUILD=build-dev NVARCH="-gencode arch=compute_90a,code=sm_90a" $tg >"$w/build.log" 2>&1; then
        echo "prep: $name: BUILD FAILED"; grep -E "error|Error" "$w/build.log" | head -5; continue
    fi
    echo "prep: $name built in $((SECONDS - t0)) s"
    st=/tmp/stage-$name; rm -rf "$st"; mkdir -p "$st/build/tests"
    git -C "$w" archive HEAD | tar -x -C "$st"
    cp -a "$w"/build-dev/laststand "$w"/build-dev/*.so* "$st/build/"
    if [ "$name" = main ]; then
        cp -a "$w"/build-dev/tests/test_* "$st/build/tests/" 2>/dev/null
    else  # a helper's bundle: the unit binaries its script names
        for t in $(grep -oh 'test_[a-z0-9_]*' "$w"/bench/device/$name*.sh "$w"/bench/device/$name*.py 2>/dev/null | sort -u); do
            [ -x "$w/build-dev/tests/$t" ] && cp -a "$w/build-dev/tests/$t" "$st/build/tests/"
        done
    fi
    rm -f "$st"/build/tests/*.d
    # the CUPTI kernel tracer of bench/device/dectrace.sh (the GPU machine has no nsys), libcupti beside it
    cu=${CUDA_HOME:-/usr/local/cuda}
    if [ -f "$w/bench/tools/cutrace.c" ] && [ -f "$cu/lib64/libcupti.so" ]; then
        gcc -shared -fPIC -O2 -I"$cu/include" "$w/bench/tools/cutrace.c" -L"$cu/lib64" -lcupti \
            -Wl,-rpath,'$ORIGIN' -o "$st/build/libcutrace.so" &&
            cp -L "$cu"/lib64/libcupti.so.[0-9]* "$st/build/" 2>/dev/null
    fi
    strip --strip-debug "$st"/build/laststand "$st"/build/tests/test_* 2>/dev/null
    tar -C "$st" -cf - . | xz -T1 --lzma2=preset=3,dict=256MiB > .dev/int/$name.tar.xz
    echo "prep: $name packed $(du -h .dev/int/$name.tar.xz | cut -f1)"
done
if [ $FIX = 1 ] && [ ! -f .dev/int/fixtures.tar ]; then
    tar -C ../shared/fixtures -cf .dev/int/fixtures.tar models
fi
cp bench/int/round.sh .dev/int/round.sh
du -sh .dev/int; du -sh --exclude=.git --exclude=build --exclude=.dev .
# On the GPU machine (device tool), e.g. with carry [".dev/int/round.sh", ".dev/int/NAME.tar.xz", ...]
# (64 MiB in all with the tree: ~3 bundles a call, fixtures.tar 21 MB):
#   OUT=$OUT DEADLINE=560 LIMIT_<script>=N bash .dev/int/round.sh main:gputests NAME ...
