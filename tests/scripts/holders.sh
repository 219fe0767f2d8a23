# Prints `alive PID` for each pid in ./pids still running, and every /proc file of a live
# process whose environment or command line holds the value in ./needle (read with -f, so
# that no command line holds it), then `checked`.
for p in $(cat pids); do
  if [ -e "/proc/$p" ] && ! grep -q '^State:.*Z' "/proc/$p/status" 2>/dev/null; then echo "alive $p"; fi
done
grep -lF -f needle /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null || true
echo checked
