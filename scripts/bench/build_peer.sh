#!/usr/bin/env bash
# Build the peers the peer benchmark (scripts/bench/bench_peer.py) and the ik interop test compare
# against, CPU-only and OUTSIDE this repository (their code is never committed here):
#   1. ik_llama.cpp (the other runtime of Laguna DFlash drafters): llama-spec-bench, llama-cli,
#      llama-bench and llama-server (the agent-session benchmark's peer server), from a snapshot of
#      github.com/ikawrakow/ik_llama.cpp;
#   2. the llama.cpp vendored by our patched llama-cpp-python sdist: its own C++ llama-bench and
#      llama-completion, the "C++ floor" our plain decoding is measured against.
#
#   IK_LLAMA_GIT=/path/to/ik_llama.cpp.git scripts/bench/build_peer.sh        # both
#   IK_LLAMA_GIT=... scripts/bench/build_peer.sh ik                           # only ik_llama.cpp
#   scripts/bench/build_peer.sh vendored                                      # only the vendored tools
#
# IK_LLAMA_GIT is a git directory (bare or not) holding the snapshot; its HEAD is exported with
# `git archive`. Snapshots made for code reading may lack a few blobs (web UI bundles, vocab
# test files): those paths are left out, none of them is needed by the targets built here.
# Binaries land in  $PEER_DIR/ik_llama.cpp/build/bin  and  $PEER_DIR/llama.cpp-vendored/build/bin
# (PEER_DIR defaults to ${LAGUNA_DFLASH_CACHE:-$HOME/.cache/laguna-dflash}/peer). A finished
# build is not redone (delete its directory to rebuild). JOBS (default 2) sets the parallelism.
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
PEER_DIR=${PEER_DIR:-${LAGUNA_DFLASH_CACHE:-$HOME/.cache/laguna-dflash}/peer}
JOBS=${JOBS:-2}
what=${1:-all}
case "$what" in
    all|ik|vendored) ;;
    *) echo "build_peer.sh: argument: expected all, ik or vendored, found '$what'" >&2; exit 2 ;;
esac

log() { echo "[build_peer] $*"; }

IK_TARGETS=(llama-spec-bench llama-cli llama-bench llama-server)

ik_configure() {
    cmake -S "$1/src" -B "$1/build" -G Ninja \
        -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_IQK_FA_ALL_QUANTS=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_CURL=OFF
}

build_ik() {
    local root=$PEER_DIR/ik_llama.cpp
    if [[ -f $root/.complete ]]; then
        local target lacking=()
        for target in "${IK_TARGETS[@]}"; do
            [[ -x $root/build/bin/$target ]] || lacking+=("$target")
        done
        if ((${#lacking[@]} == 0)); then
            log "ik_llama.cpp already built ($(cat "$root/.complete")): $root/build/bin"
            return
        fi
        # a build from before a target joined the list: add it to the same tree
        log "ik_llama.cpp built without ${lacking[*]}: building them"
        ik_configure "$root"
        cmake --build "$root/build" -j "$JOBS" --target "${lacking[@]}"
        return
    fi
    if [[ -z ${IK_LLAMA_GIT:-} ]]; then
        echo "build_peer.sh: IK_LLAMA_GIT: expected a git directory holding a snapshot of" \
             "ikawrakow/ik_llama.cpp, found it unset" >&2
        exit 2
    fi
    if ! git --git-dir="$IK_LLAMA_GIT" rev-parse --verify -q HEAD >/dev/null 2>&1; then
        echo "build_peer.sh: IK_LLAMA_GIT: expected a git directory with a HEAD commit, found '$IK_LLAMA_GIT'" >&2
        exit 2
    fi
    local commit
    commit=$(git --git-dir="$IK_LLAMA_GIT" rev-parse HEAD)
    # paths whose blobs the snapshot does not hold: git archive stops at the first of them
    local excludes=() listing
    listing=$(git --git-dir="$IK_LLAMA_GIT" ls-tree -r HEAD)
    while IFS= read -r path; do
        excludes+=(":(exclude)$path")
    done < <(awk '$2 == "blob" {print $3}' <<<"$listing" \
        | git --git-dir="$IK_LLAMA_GIT" cat-file --batch-check \
        | awk -F'\t' 'NR == FNR {if ($0 ~ / missing$/) {split($0, w, " "); lacking[w[1]] = 1}; next}
                       {split($1, f, " "); if (f[2] == "blob" && (f[3] in lacking)) print $2}' - <(echo "$listing"))
    ((${#excludes[@]})) && log "snapshot lacks ${#excludes[@]} file(s), left out: ${excludes[*]#:(exclude)}"
    rm -rf "$root"
    mkdir -p "$root/src"
    # git still names the first lacking blob on stderr ("invalid object"), and exits 0
    git --git-dir="$IK_LLAMA_GIT" archive --format=tar HEAD -- . "${excludes[@]}" | tar -x -C "$root/src"
    log "ik_llama.cpp ${commit:0:10} exported to $root/src"
    local t0=$SECONDS
    ik_configure "$root"
    cmake --build "$root/build" -j "$JOBS" --target "${IK_TARGETS[@]}"
    echo "$commit" > "$root/.complete"
    log "ik_llama.cpp built in $((SECONDS - t0)) s: $root/build/bin"
}

build_vendored() {
    local root=$PEER_DIR/llama.cpp-vendored
    local tree
    tree=$("$REPO/.venv/bin/python" "$REPO/scripts/build_wheel.py" --source-dir)/vendor/llama.cpp
    # the source tree's cache key names the patches applied: a new key is a new build
    local key
    key=$(basename "$(dirname "$(dirname "$(dirname "$tree")")")")
    if [[ -f $root/.complete && $(cat "$root/.complete") == "$key" ]]; then
        log "vendored llama.cpp tools already built (source key $key): $root/build/bin"
        return
    fi
    if [[ ! -f $tree/CMakeLists.txt ]]; then
        echo "build_peer.sh: $tree/CMakeLists.txt: expected the patched sdist's llama.cpp, found none" >&2
        exit 2
    fi
    rm -rf "$root"
    mkdir -p "$root"
    local t0=$SECONDS
    # the wheel's own flags (runtime/setup/wheel.py: build_flags) plus the tools; llama-cli of this
    # llama.cpp is built on its server and web UI, so the plain generator is llama-completion
    cmake -S "$tree" -B "$root/build" -G Ninja \
        -DCMAKE_BUILD_TYPE=Release -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF
    cmake --build "$root/build" -j "$JOBS" --target llama-bench llama-completion
    echo "$key" > "$root/.complete"
    log "vendored llama.cpp tools built in $((SECONDS - t0)) s: $root/build/bin"
}

[[ $what == all || $what == ik ]] && build_ik
[[ $what == all || $what == vendored ]] && build_vendored
exit 0
