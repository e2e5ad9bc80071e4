/* The event writer: this process's files in the capture folder (events-<pid>.jsonl, one JSON
 * line per event; snapshots-<pid>.bin, the snapshots' kept values; values-<pid>.bin, --deep's
 * changed bytes), written under one lock in program order, buffered, made anew under its own
 * pid by a child forked without exec, and ended by an "exit" event when the process leaves
 * through exit().
 *
 * The traced command runs in this process and knows the folder (EGF_CAPTURE_DIR): whatever it
 * put there is never written to. The folder is opened once, refused if it is a link, and every
 * file is made in it by name with O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC: a file or a link already
 * at a name (planted to have the recorder overwrite what it points at) is refused, and the
 * process then records nothing more: one line on stderr says so, and where its events file is
 * its own, a note in it, which no exit event follows (the capture is incomplete). No descriptor
 * of the recorder's outlives an exec.
 */
#include "recorder.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <unistd.h>

static struct {
    pthread_mutex_t lock;
    char dir[4096];     // the capture folder's path, as the messages name it
    int dir_fd;         // the folder, opened once: every file is made in it
    dev_t dir_dev;      // ... and what it is, so a forked child that finds another file at that
    ino_t dir_ino;      //     descriptor (the trainer closed it and opened something) refuses
    FILE *events;
    FILE *snapshots;
    long long snapshot_bytes;
    FILE *values;
    unsigned long long values_bytes;  // written to this process's values file
    pid_t pid;                        // the process that made (or was refused) the files
    unsigned long long seq;
    int exited;  // the exit event is written: nothing follows it in the file
} w = {.lock = PTHREAD_MUTEX_INITIALIZER, .dir_fd = -1};

// One line on the trainer's stderr: the only place left to say why nothing is recorded.
__attribute__((format(printf, 1, 2))) static void say(const char *fmt, ...) {
    char line[4400];
    va_list args;
    va_start(args, fmt);
    vsnprintf(line, sizeof line, fmt, args);
    va_end(args);
    fprintf(stderr, "egf-audit recorder: process %d records nothing: %s\n", (int)getpid(), line);
}

// `name`, made anew in the capture folder (0666 less the umask, as fopen makes files); NULL
// with errno set when it cannot be: something is there already (EEXIST, for a link whatever it
// points at), or the folder refuses it.
static FILE *create_locked(const char *name, const char *mode) {
    int fd = openat(w.dir_fd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, mode);
    if (!f) close(fd);
    return f;
}

static int same_folder_locked(void) {
    struct stat st;
    return fstat(w.dir_fd, &st) == 0 && S_ISDIR(st.st_mode) && st.st_dev == w.dir_dev &&
           st.st_ino == w.dir_ino;
}

// This process's files, made at its first event. A fork without exec inherits our FILE*s: the
// child leaves them alone (closing them would write what they buffered into the parent's
// files; before_fork empties them, and the child never writes to them) and makes its own.
static void open_files_locked(void) {
    pid_t pid = getpid();
    if (w.pid == pid) return;  // made, or refused, at this process's first event
    w.pid = pid;
    w.events = w.snapshots = w.values = NULL;
    w.snapshot_bytes = 0;
    w.values_bytes = 0;
    if (!same_folder_locked()) {
        say("its descriptor of the capture folder %s leads elsewhere now", w.dir);
        return;
    }
    char name[64];
    snprintf(name, sizeof name, "events-%d.jsonl", (int)pid);
    FILE *events = create_locked(name, "w");
    if (!events) {
        say("cannot make %s in %s (%s)", name, w.dir, strerror(errno));
        return;
    }
    setvbuf(events, NULL, _IOFBF, 1 << 16);
    int refused = 0;
    snprintf(name, sizeof name, "snapshots-%d.bin", (int)pid);
    if (!(w.snapshots = create_locked(name, "wb"))) refused = errno ? errno : EIO;
    if (!refused && rec_options.values_on) {
        snprintf(name, sizeof name, "values-%d.bin", (int)pid);
        if (!(w.values = create_locked(name, "wb"))) refused = errno ? errno : EIO;
    }
    if (!refused) {
        w.events = events;
        return;
    }
    // the events file is this process's own: it says why, and ends there
    say("cannot make %s in %s (%s)", name, w.dir, strerror(refused));
    if (w.snapshots) fclose(w.snapshots);  // made, and empty
    w.snapshots = NULL;
    char msg[256];
    snprintf(msg, sizeof msg,
             "this process records nothing more: cannot make %s in the capture folder (%s); the "
             "recorder never writes to a file it did not make",
             name, strerror(refused));
    fprintf(events, "{\"ev\":\"note\",\"seq\":%llu,\"tid\":%lu,\"msg\":", w.seq++,
            (unsigned long)pthread_self() & 0xffffffUL);
    json_string(events, msg);
    fputs("}\n", events);
    fclose(events);
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

// The capture folder, opened as a folder and never through a link, and the handlers that end
// the files at exit and keep them whole across a fork: 1, or 0 (said on stderr) when it cannot
// be opened. The files are made at the first event.
int writer_start(const char *dir) {
    snprintf(w.dir, sizeof w.dir, "%s", dir);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        say("cannot open the capture folder %s as a folder that is no link (%s)", dir,
            strerror(errno));
        if (fd >= 0) close(fd);
        return 0;
    }
    w.dir_fd = fd;
    w.dir_dev = st.st_dev;
    w.dir_ino = st.st_ino;
    atexit(on_exit_event);
    pthread_atfork(before_fork, after_fork, after_fork);
    return 1;
}
