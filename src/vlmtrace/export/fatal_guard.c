/* The first handler of every fatal signal while vlmtrace journals (docs/journal.md, Fatal signals).
 *
 * It does only what is safe in a signal handler: it arms a timer, then calls the action behind it
 * (faulthandler, which writes Python's stacks with write(2) and passes the signal on to what was
 * installed before it: the default action or a native library's handler). If that chain has not
 * finished within the bound, the timer's handler ends the process with the fatal signal's default
 * action: a library handler that hangs cannot keep a dying process alive. A chain that comes back
 * (a library that handled the signal) disarms the timer and puts the process's own back.
 *
 * A second entry while a chain runs (a handler behind that passes the signal back to the front, a fault
 * inside the chain, two threads faulting at once) takes the first signal's default action at once: the
 * chain can never become a cycle, and the process dies by the signal that started it.
 * No locks, no allocation, no Python: sigaction, setitimer, pthread_sigmask and raise only.
 *
 * For a terminating signal (SIGTERM) that vlmtrace handles in Python to write the journal's end record,
 * the same library bounds the wait for that handler: Python runs it only once the main thread runs
 * Python again, which a long native call can delay. `terminating` arms a timer and passes the signal on
 * to Python's handler; if the process has not ended when the timer fires, it ends by the signal's
 * default action, as it would have at once without vlmtrace.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#define SIGNALS 65

static struct sigaction behind[SIGNALS];    /* per signal, the action the guard passes the signal on to */
static volatile sig_atomic_t dying;         /* the fatal signal whose chain is running; 0 when none */
static volatile sig_atomic_t ending;        /* the terminating signal whose bound runs; 0 when none */
static long ending_bound_ms[SIGNALS];
static long bound_ms = 1500;

static void default_action(int signum)
{
    struct sigaction dfl;
    sigset_t only;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(signum, &dfl, NULL);
    sigemptyset(&only);
    sigaddset(&only, signum);
    pthread_sigmask(SIG_UNBLOCK, &only, NULL);
    raise(signum);
    _exit(128 + signum); /* a signal whose default action does not end the process (not a fatal one) */
}

static void expired(int alarm_signum)
{
    int signum = dying;
    (void)alarm_signum;
    if (signum)
        default_action(signum);
}

static void pass_on(int signum, siginfo_t *info, void *context)
{
    struct sigaction next = behind[signum];
    if (next.sa_flags & SA_SIGINFO)
        next.sa_sigaction(signum, info, context);
    else if (next.sa_handler == SIG_DFL)
        default_action(signum);
    else if (next.sa_handler != SIG_IGN)
        next.sa_handler(signum);
}

static void ending_expired(int alarm_signum)
{
    int signum = ending;
    (void)alarm_signum;
    if (signum)
        default_action(signum);
}

static void terminating(int signum, siginfo_t *info, void *context)
{
    if (signum <= 0 || signum >= SIGNALS)
        return;
    if (__sync_bool_compare_and_swap(&ending, 0, signum)) {
        struct sigaction on_timer;
        struct itimerval bound;
        memset(&on_timer, 0, sizeof on_timer);
        on_timer.sa_handler = ending_expired;
        sigfillset(&on_timer.sa_mask);
        sigaction(SIGALRM, &on_timer, NULL);
        memset(&bound, 0, sizeof bound);
        bound.it_value.tv_sec = ending_bound_ms[signum] / 1000;
        bound.it_value.tv_usec = (ending_bound_ms[signum] % 1000) * 1000;
        setitimer(ITIMER_REAL, &bound, NULL);
    }
    pass_on(signum, info, context);
}

static void guard(int signum, siginfo_t *info, void *context)
{
    struct sigaction on_timer, timer_before;
    struct itimerval bound, timer_left;

    if (signum <= 0 || signum >= SIGNALS)
        return;
    if (!__sync_bool_compare_and_swap(&dying, 0, signum)) {
        /* a fault inside the chain (faulthandler reading a frame that another thread is changing) ends
           the process by the signal that started it */
        int first = dying;
        default_action(first ? first : signum);
    }
    memset(&on_timer, 0, sizeof on_timer);
    on_timer.sa_handler = expired;
    sigfillset(&on_timer.sa_mask);
    sigaction(SIGALRM, &on_timer, &timer_before);
    memset(&bound, 0, sizeof bound);
    bound.it_value.tv_sec = bound_ms / 1000;
    bound.it_value.tv_usec = (bound_ms % 1000) * 1000;
    setitimer(ITIMER_REAL, &bound, &timer_left);

    pass_on(signum, info, context);

    setitimer(ITIMER_REAL, &timer_left, NULL);
    sigaction(SIGALRM, &timer_before, NULL);
    dying = 0;
}

/* Put the guard in front of `signum`'s action, which it then passes the signal on to. 0 on success. */
int vlmtrace_guard_front(int signum)
{
    struct sigaction now, front;
    if (signum <= 0 || signum >= SIGNALS || sigaction(signum, NULL, &now) != 0)
        return -1;
    if (!(now.sa_flags & SA_SIGINFO) || now.sa_sigaction != guard)
        behind[signum] = now;
    memset(&front, 0, sizeof front);
    front.sa_sigaction = guard;
    sigemptyset(&front.sa_mask);
    front.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    return sigaction(signum, &front, NULL);
}

/* The action the guard passes `signum` on to, as installed now (used once faulthandler is disabled). */
int vlmtrace_guard_behind_installed(int signum)
{
    struct sigaction now;
    if (signum <= 0 || signum >= SIGNALS || sigaction(signum, NULL, &now) != 0)
        return -1;
    if (!(now.sa_flags & SA_SIGINFO) || now.sa_sigaction != guard)
        behind[signum] = now;
    return 0;
}

/* Put `terminating` in front of `signum`'s action (Python's handler), bounding the process's end by
   `bound_ms` from the signal. Called again, it only changes the bound. 0 on success. */
int vlmtrace_guard_terminating(int signum, long bound_ms)
{
    struct sigaction now, front;
    if (signum <= 0 || signum >= SIGNALS || bound_ms <= 0 || sigaction(signum, NULL, &now) != 0)
        return -1;
    ending_bound_ms[signum] = bound_ms;
    if ((now.sa_flags & SA_SIGINFO) && now.sa_sigaction == terminating)
        return 0;
    behind[signum] = now;
    front = now;
    front.sa_sigaction = terminating;
    front.sa_flags = (now.sa_flags | SA_SIGINFO) & ~SA_RESETHAND;
    return sigaction(signum, &front, NULL);
}

/* Whether a fatal signal's chain is running now: the handlers are being taken down, not taken over. */
int vlmtrace_guard_dying(void)
{
    return dying;
}

void vlmtrace_guard_set_bound_ms(long milliseconds)
{
    if (milliseconds > 0)
        bound_ms = milliseconds;
}

/* The guard's address, to tell it from another handler in `struct sigaction`. */
void *vlmtrace_guard_address(void)
{
    return (void *)guard;
}
