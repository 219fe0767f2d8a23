# A step that leaves processes hiding in every way an attacker would, each exec'd into a
# sleep and its pid written to ./pids, and waits until all five run: one that unsets the
# variables an executor could mark it with and leaves the session; one with a cleared
# environment but a copy of $TOKEN; a double fork that ignores SIGTERM; one stopped; one in
# its own session with $TOKEN in its environment.
rm -f pids
(unset KNOTLESS_STEP KNOTLESS_SHELL_SESSION KNOTLESS_STEP_MARKER; setsid sh -c 'echo $$ >> pids; exec sleep 600' </dev/null >/dev/null 2>&1 &)
setsid env -i COPY="$TOKEN" sh -c 'echo $$ >> pids; exec sleep 600' </dev/null >/dev/null 2>&1 &
sh -c 'sh -c "trap \"\" TERM; echo \$\$ >> pids; exec sleep 600" </dev/null >/dev/null 2>&1 & exit 0'
sh -c 'echo $$ >> pids; kill -STOP $$; exec sleep 600' </dev/null >/dev/null 2>&1 &
setsid sh -c 'echo $$ >> pids; exec sleep 601' </dev/null >/dev/null 2>&1 &
while [ "$(cat pids 2>/dev/null | wc -l)" -lt 5 ]; do sleep 0.01; done
