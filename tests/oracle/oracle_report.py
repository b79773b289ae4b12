"""The oracle scripts' report: one line per check, `ok   ...` or `FAIL ...`, and the count of
failures the script's exit status comes from (oracle_report.failures)."""

failures = 0


def ok(msg):
    print(f"ok   {msg}")


def fail(msg):
    global failures
    failures += 1
    print(f"FAIL {msg}")


def check(cond, msg):
    (ok if cond else fail)(msg)
    return cond
