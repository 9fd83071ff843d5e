#!/bin/bash
# Stand-in program for the restart benchmark: note "<pid> <start time>" in the marker file
# named by $1, then idle as the same process (exec keeps the pid).
printf '%s %s\n' "$$" "$EPOCHREALTIME" >> "$1"
exec sleep infinity
