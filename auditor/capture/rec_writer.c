/* The event writer: this process's files in the capture folder (events-<pid>.jsonl, one JSON
 * line per event; snapshots-<pid>.bin, the snapshots' kept values; values-<pid>.bin, --deep's
 * changed bytes), written under one lock in program order, buffered, reopened under its own pid
 * by a child forked without exec, and ended by an "exit" event when the process leaves through
 * exit().
 */
#include "recorder.h"

#include <unistd.h>

static struct {
    pthread_mutex_t lock;
    char dir[4096];
    FILE *events;
    FILE *snapshots;
    long long snapshot_bytes;
    FILE *values;
    unsigned long long values_bytes;  // written to this process's values file
    pid_t pid;                        // the process the files are this process's for
    unsigned long long seq;
    int exited;  // the exit event is written: nothing follows it in the file
} w = {.lock = PTHREAD_MUTEX_INITIALIZER};

// values-<pid>.bin, opened anew. A forked child leaves its copy of the parent's stream alone,
// as it does the events' (closing it would write what it buffered into the parent's file;
// before_fork empties it, and the child never writes to it).
static void open_values_locked(pid_t pid) {
    char path[4200];
    snprintf(path, sizeof path, "%s/values-%d.bin", w.dir, (int)pid);
    w.values = fopen(path, "wb");
    w.values_bytes = 0;
}

static void open_files_locked(void) {
    pid_t pid = getpid();
    if (w.events && w.pid == pid) {
        // values turned on after the first event
        if (rec_options.values_on && !w.values) open_values_locked(pid);
        return;
    }
    // A fork without exec inherits our FILE*s: the child writes its own files. (Their buffers
    // were flushed just before the fork, before_fork: the child never writes the parent's
    // lines a second time when it flushes every stream at exit.)
    w.pid = pid;
    char path[4200];
    snprintf(path, sizeof path, "%s/events-%d.jsonl", w.dir, (int)pid);
    w.events = fopen(path, "w");
    snprintf(path, sizeof path, "%s/snapshots-%d.bin", w.dir, (int)pid);
    w.snapshots = fopen(path, "wb");
    w.snapshot_bytes = 0;
    if (rec_options.values_on) open_values_locked(pid);
    if (w.events) setvbuf(w.events, NULL, _IOFBF, 1 << 16);
}

void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; s && *s; ++s) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            fputc('\\', f);
            fputc(c, f);
        } else if (c == '\n') {
            fputs("\\n", f);
        } else if (c < 0x20) {
            fprintf(f, "\\u%04x", c);
        } else {
            fputc(c, f);
        }
    }
    fputc('"', f);
}

// Starts one event line and returns the stream to add its fields to, then end_event(); holds
// the lock until then. NULL: the event is not recorded (no file, or after the exit event).
FILE *begin_event(const char *ev) {
    pthread_mutex_lock(&w.lock);
    if (w.exited && w.pid == getpid()) {  // teardown after the exit event: not recorded
        pthread_mutex_unlock(&w.lock);
        return NULL;
    }
    open_files_locked();
    if (!w.events) {
        pthread_mutex_unlock(&w.lock);
        return NULL;
    }
    fprintf(w.events, "{\"ev\":\"%s\",\"seq\":%llu,\"tid\":%lu", ev, w.seq++,
            (unsigned long)pthread_self() & 0xffffffUL);
    if (rec_thread.rt_depth > 0) rec_thread.rt_covered = 1;
    return w.events;
}

void end_event(FILE *f) {
    fputs("}\n", f);
    pthread_mutex_unlock(&w.lock);
}

unsigned long long event_seq(void) { return w.seq - 1; }

void note(const char *msg) {
    FILE *f = begin_event("note");
    if (!f) return;
    fputs(",\"msg\":", f);
    json_string(f, msg);
    end_event(f);
    pthread_mutex_lock(&w.lock);
    if (w.events) fflush(w.events);
    pthread_mutex_unlock(&w.lock);
}

void flush_all(void) {
    pthread_mutex_lock(&w.lock);
    if (w.events && w.pid == getpid()) fflush(w.events);
    if (w.snapshots && w.pid == getpid()) fflush(w.snapshots);
    if (w.values && w.pid == getpid()) fflush(w.values);
    pthread_mutex_unlock(&w.lock);
}

// Within an event: `count` values appended to the snapshots file; their offset in it.
long long write_snapshot_values(const float *values, long long count) {
    long long offset = w.snapshot_bytes;
    if (count > 0 && w.snapshots) {
        fwrite(values, sizeof(float), (size_t)count, w.snapshots);
        w.snapshot_bytes += count * (long long)sizeof(float);
    }
    return offset;
}

// Within an event: `n` bytes appended to the values file and `"values":offset` to the event
// (1). 0: there is no values file (nothing written); -1: the write fell short, and the file now
// holds a partial write, so no later offset would be true.
int write_values(FILE *event, const void *bytes, size_t n) {
    if (!w.values) return 0;
    if (n && fwrite(bytes, 1, n, w.values) != n) return -1;
    fprintf(event, ",\"values\":%llu", w.values_bytes);
    w.values_bytes += n;
    return 1;
}

unsigned long long values_written(void) { return w.values_bytes; }

// atexit: the process ends through exit(). Only the process that owns the files writes the exit
// event (a child forked without exec that recorded nothing owns none, and writes nothing); it is
// the file's last line: whatever the teardown launches or logs after it is not recorded.
static void on_exit_event(void) {
    pthread_mutex_lock(&w.lock);
    pid_t pid = getpid();
    if (w.events && w.pid == pid && !w.exited) {
        fprintf(w.events, "{\"ev\":\"exit\",\"seq\":%llu,\"tid\":%lu,\"pid\":%d}\n", w.seq++,
                (unsigned long)pthread_self() & 0xffffffUL, (int)pid);
        w.exited = 1;
    }
    if (w.events && w.pid == pid) fflush(w.events);
    if (w.snapshots && w.pid == pid) fflush(w.snapshots);
    if (w.values && w.pid == pid) fflush(w.values);
    pthread_mutex_unlock(&w.lock);
}

// fork: no event is half written across it, and the streams are empty when the child inherits
// them (it would flush the parent's buffered lines into the parent's files a second time).
static void before_fork(void) {
    pthread_mutex_lock(&w.lock);
    if (w.events && w.pid == getpid()) fflush(w.events);
    if (w.snapshots && w.pid == getpid()) fflush(w.snapshots);
    if (w.values && w.pid == getpid()) fflush(w.values);
}

static void after_fork(void) { pthread_mutex_unlock(&w.lock); }

// The capture folder, and the handlers that end the files at exit and keep them whole across
// a fork. The files are opened at the first event.
void writer_start(const char *dir) {
    snprintf(w.dir, sizeof w.dir, "%s", dir);
    atexit(on_exit_event);
    pthread_atfork(before_fork, after_fork, after_fork);
}
