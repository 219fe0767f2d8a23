#!/bin/sh
# A tiny shell test suite: each check prints ok or fails the run.
set -e

failures=0

check() {
    name=$1
    expected=$2
    actual=$3
    if [ "$expected" = "$actual" ]; then
        echo "ok - $name"
    else
        echo "not ok - $name: expected '$expected', got '$actual'"
        failures=$((failures + 1))
    fi
}

check "addition" 4 "$((2 + 2))"
check "uppercase" "HELLO" "$(echo hello | tr a-z A-Z)"
check "word count" 3 "$(echo one two three | wc -w | tr -d ' ')"
check "CI is set" true "${CI:-}"

if [ "${TEST_VERBOSE:-0}" = 1 ]; then
    echo "ran in $(pwd)"
fi

[ "$failures" -eq 0 ]
