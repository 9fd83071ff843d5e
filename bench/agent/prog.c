/* Stand-in program for the restart benchmark: append "<pid> <start time>" to the marker file
 * named by argv[1], then idle as the same process. It never execs into another program (the
 * shell script it replaces ran `exec sleep`), so the agent's check of what its node runs sees
 * the file it started, and no restart but the benchmark's own kills happens. */
#include <stdio.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    if (argc < 2)
        return 2;
    FILE *marker = fopen(argv[1], "a");
    if (!marker)
        return 1;
    fprintf(marker, "%d %ld.%06ld\n", (int)getpid(), (long)now.tv_sec, now.tv_nsec / 1000);
    fclose(marker);
    for (;;)
        pause();
}
