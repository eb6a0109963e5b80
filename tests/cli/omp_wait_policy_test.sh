#!/bin/sh
# The mm3 command runs with OMP_WAIT_POLICY=PASSIVE unless the user set a policy (tools/mm3/main.cpp:
# libgomp reads it before main(), so the command sets it and executes itself again). The bench JSON
# reports the policy the process ran with.
# Usage: omp_wait_policy_test.sh MM3_BINARY
set -u
mm3=$1
policy() { "$@" bench --stage peak_f32_fma --runs 1 --warmup 0 --json | sed -n 's/.*"omp_wait_policy":"\([^"]*\)".*/\1/p'; }
got=$(policy env -u OMP_WAIT_POLICY "$mm3")
[ "$got" = "PASSIVE" ] || { echo "unset OMP_WAIT_POLICY: the process ran with '$got', expected PASSIVE"; exit 1; }
got=$(policy env OMP_WAIT_POLICY=active "$mm3")
[ "$got" = "active" ] || { echo "OMP_WAIT_POLICY=active: the process ran with '$got', expected the user's value"; exit 1; }
echo "ok: PASSIVE by default, the user's value kept"
