#!/bin/sh
# Run kvlane's Python tests: run_tests.sh PYTHON TESTDIR [python options...]
# Exit 77 (skip) only when pytest or numpy is missing.
py="$1"; dir="$2"; shift 2
if ! "$py" -c 'import pytest' 2>/dev/null; then
    echo "SKIP: pytest is not installed for $py (apt install python3-pytest)"; exit 77
fi
if ! "$py" -c 'import numpy' 2>/dev/null; then
    echo "SKIP: numpy is not installed for $py (apt install python3-numpy)"; exit 77
fi
exec "$py" "$@" -m pytest -q -p no:cacheprovider "$dir"
