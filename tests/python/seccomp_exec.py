"""Runs a program under the system call filter systemd would give it from a unit's
`SystemCallFilter=` (the allowed calls, already expanded from their @groups),
`SystemCallErrorNumber=`, `RestrictAddressFamilies=` and `MemoryDenyWriteExecute=`, for
test_systemd_sandbox.py where PID 1 is not systemd. libseccomp (Debian's libseccomp2, which
systemd itself links) through ctypes, then exec: the filter stays on the program and on
everything it starts.

    seccomp_exec.py --allow FILE --errno 1 --families 1,2,10 --mdwe -- PROGRAM ARGS...

FILE: one system call name a line. Calls not in it fail with the errno; a call this
architecture does not have is skipped, as systemd skips it. Run it with no new privileges
(setpriv --no-new-privs): an unprivileged process may only load a filter then."""

import argparse
import ctypes
import os
import sys

ACT_ALLOW = 0x7FFF0000
CMP_EQ, CMP_GE, CMP_MASKED_EQ = 4, 5, 7
PROT_WRITE, PROT_EXEC = 0x2, 0x4
SHM_EXEC = 0o100000
EAFNOSUPPORT = 97


def act_errno(n):
    return 0x00050000 | (n & 0xFFFF)


class ArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--allow", required=True)
    p.add_argument("--errno", type=int, default=1)
    p.add_argument("--families", default="", help="allowed socket() domains, numbers")
    p.add_argument("--mdwe", action="store_true", help="MemoryDenyWriteExecute=yes")
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("no program")

    lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(ArgCmp),
    ]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]

    ctx = lib.seccomp_init(act_errno(args.errno))
    if not ctx:
        sys.exit("seccomp_init failed")

    def rule(action, name, *cmps):
        nr = lib.seccomp_syscall_resolve_name(name.encode())
        if nr < 0:
            return  # not a call of this architecture
        array = (ArgCmp * max(1, len(cmps)))(*[ArgCmp(*c) for c in cmps])
        rc = lib.seccomp_rule_add_array(ctx, action, nr, len(cmps), array)
        if rc < 0:
            sys.exit(f"seccomp rule for {name}: {os.strerror(-rc)}")

    with open(args.allow) as f:
        allowed = {line.strip() for line in f if line.strip()}
    families = [int(x) for x in args.families.split(",") if x]
    special = {"socket"} if families else set()
    if args.mdwe:
        special |= {"mmap", "mprotect", "pkey_mprotect", "shmat"}
    for name in sorted(allowed - special):
        rule(ACT_ALLOW, name)
    if "socket" in special and "socket" in allowed:
        # RestrictAddressFamilies=: socket() of another domain fails with EAFNOSUPPORT.
        for fam in families:
            rule(ACT_ALLOW, "socket", (0, CMP_EQ, fam, 0))
        for fam in range(0, max(families)):
            if fam not in families:
                rule(act_errno(EAFNOSUPPORT), "socket", (0, CMP_EQ, fam, 0))
        rule(act_errno(EAFNOSUPPORT), "socket", (0, CMP_GE, max(families) + 1, 0))
    if args.mdwe:
        # MemoryDenyWriteExecute=: no mapping both writable and executable, no page made
        # executable later, no executable shared memory.
        wx = PROT_WRITE | PROT_EXEC
        for ok in (0, PROT_WRITE, PROT_EXEC):
            if "mmap" in allowed:
                rule(ACT_ALLOW, "mmap", (2, CMP_MASKED_EQ, wx, ok))
        for name in ("mprotect", "pkey_mprotect"):
            if name in allowed:
                rule(ACT_ALLOW, name, (2, CMP_MASKED_EQ, PROT_EXEC, 0))
        if "shmat" in allowed:
            rule(ACT_ALLOW, "shmat", (2, CMP_MASKED_EQ, SHM_EXEC, 0))
    rc = lib.seccomp_load(ctx)
    if rc < 0:
        sys.exit(f"seccomp_load: {os.strerror(-rc)} (no new privileges set?)")
    os.execv(command[0], command)


if __name__ == "__main__":
    main()
