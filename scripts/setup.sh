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
    # Test oracles from PyPI: the official OpenAI SDK, HF tokenizers, pytest.
    need=()
    python3 -c "import openai" 2>/dev/null || need+=(openai)
    python3 -c "import pytest" 2>/dev/null || need+=(pytest)
    python3 -c "import tokenizers" 2>/dev/null || need+=(tokenizers)
    python3 -c "import numpy" 2>/dev/null || need+=(numpy)
    # chat-template oracle: the transformers release that wrote ../shared/fixtures (no torch needed)
    python3 -c "import jinja2" 2>/dev/null || need+=("jinja2>=3.1.6")
    python3 -c "import transformers, sys; sys.exit(transformers.__version__ != '5.17.0')" 2>/dev/null || \
        need+=("transformers==5.17.0")
    if [ ${#need[@]} -gt 0 ]; then
        echo "setup: pip installing ${need[*]}" >&2
        python3 -m pip install -q "${need[@]}" 2>/dev/null || \
            python3 -m pip install -q --break-system-packages "${need[@]}"
    fi
fi
