# Waiting for an event in the shell tests, sourced by each that waits (tests/integration/lib.sh
# for the daemon's); it defines nothing else and starts nothing, so any script may source it:
#   wait_until TIMEOUT_S COMMAND...  runs COMMAND (a program or a shell function, its output
#                                    discarded) every 50 ms until it succeeds (0) or TIMEOUT_S
#                                    seconds of wall clock pass (1)
# The way to wait for an event (a log line, a file, a state): never a bare sleep. A function
# given as COMMAND runs in the calling shell, so what it sets stays set after the wait.
wait_until() {
    local deadline=$((SECONDS + $1)); shift
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -ge $deadline ] && return 1
        sleep 0.05
    done
}
