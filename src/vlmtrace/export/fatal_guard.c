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

static void guard(int signum, siginfo_t *info, void *context)
{
    struct sigaction next, on_timer, timer_before;
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

    next = behind[signum];
    if (next.sa_flags & SA_SIGINFO)
        next.sa_sigaction(signum, info, context);
    else if (next.sa_handler == SIG_DFL)
        default_action(signum);
    else if (next.sa_handler != SIG_IGN)
        next.sa_handler(signum);

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
