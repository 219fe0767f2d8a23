#!/usr/bin/env python3
"""python-example: a knotless executor in one file of Python 3.11, standard library only.

Like the shell executor, it isolates nothing: a session is a folder on this host,
<work-dir>/<runner-id>/<session>/, and a step is `/bin/sh -ec SCRIPT` run as this user.
It reads /proc to find a session's processes, so it runs on Linux.
The protocol is docs/reference/protocol.md; the sections below follow the guide,
docs/guide/writing-an-executor.md.
"""

import base64
import ctypes
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import PurePosixPath

NAME, VERSION = "python-example", "0.1.0"
SUPPORTED_VERSIONS = [1]
OPTIONS = {"work-dir"}
MAX_FRAME = 8 * 1024 * 1024  # bytes in one line, newline included
CHUNK = 64 * 1024  # the most output bytes in one `output` notification
GRACE = 2.0  # seconds between SIGTERM and SIGKILL
SETTLE = 0.2  # seconds to read on after a step's shell exited, while its pipes stay open
MARKER = "KNOTLESS_PYTHON_SESSION"  # in every step's environment: <runner-id>/<session>
PR_SET_CHILD_SUBREAPER = 36  # prctl(2): orphans of our descendants come back to us, not to init

PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL = -32700, -32600, -32601, -32602, -32603
INFRASTRUCTURE, CONFIGURATION, CANCELLED, TIMEOUT, UNSUPPORTED_VERSION = -32001, -32002, -32003, -32004, -32005
UNKNOWN_SESSION, NOT_FOUND, TOO_LARGE, NOT_INITIALIZED = -32006, -32007, -32008, -32009


class RpcError(Exception):
    """An error response: raise it anywhere in a handler and the request is answered with it."""

    def __init__(self, code, message, data=None):
        super().__init__(message)
        self.code, self.message, self.data = code, message, data


def diag(message):
    """A diagnostic line for the runner's log: stderr, never stdout, never a secret."""
    print(f"{NAME}: {message}", file=sys.stderr, flush=True)


# --- Framing: one JSON object a line on stdout, written whole under a lock, flushed ----------


class Wire:
    def __init__(self):
        # Keep the real stdout for protocol frames only, and point fd 1 at stderr, so that a
        # stray print() or an inherited descriptor can never corrupt the stream.
        self.out = os.fdopen(os.dup(1), "wb")
        os.dup2(2, 1)
        sys.stdout = sys.stderr
        self.lock = threading.Lock()

    def send(self, message):
        line = json.dumps(message, separators=(",", ":")).encode() + b"\n"
        with self.lock:
            self.out.write(line)
            self.out.flush()

    def result(self, id, result):
        self.send({"jsonrpc": "2.0", "id": id, "result": result})

    def error(self, id, code, message, data=None):
        error = {"code": code, "message": message}
        if data is not None:
            error["data"] = data
        self.send({"jsonrpc": "2.0", "id": id, "error": error})

    def notify(self, method, params):
        self.send({"jsonrpc": "2.0", "method": method, "params": params})


def field(params, name, kind, default=...):
    """params[name], checked against its type; a missing required field is INVALID_PARAMS."""
    value = params.get(name)
    if value is None:
        if default is ...:
            raise RpcError(INVALID_PARAMS, f"missing field {name}")
        return default
    if not isinstance(value, kind) or (kind is int and (isinstance(value, bool) or value < 0)):
        raise RpcError(INVALID_PARAMS, f"field {name} must be a {kind.__name__}")
    if kind is dict and not all(isinstance(v, str) for v in value.values()):
        raise RpcError(INVALID_PARAMS, f"field {name} must map strings to strings")
    return value


def safe_name(name):
    """One path component we can put in a folder name: letters, digits, - _ . (no leading dot)."""
    return bool(name) and not name.startswith(".") and all(c.isascii() and (c.isalnum() or c in "-_.") for c in name)


# --- Processes: found in /proc by process tree, process group or marker variable, killed in two steps


def become_subreaper():
    """Makes every orphan of our steps (after `setsid` or a double fork) our child instead of
    init's, so that what a step left can be found however it left the step's tree (Linux)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        diag(f"cannot become a child subreaper: {os.strerror(ctypes.get_errno())}")


def started_at(pid):
    """When a process started, in clock ticks since boot (field 22 of /proc/PID/stat), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def reap_orphans(shells):
    """Waits for our orphans that ended, so that none stays a zombie; `shells` are the live step
    shells, which subprocess waits for itself."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in shells:
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
            state, ppid = stat[stat.rindex(b")") + 2 :].split()[:2]
            if state == b"Z" and int(ppid) == os.getpid():
                os.waitpid(int(entry), os.WNOHANG)
        except (OSError, ValueError):
            continue


def scan_processes():
    """Every live process of this user but us, as (pid, parent, process group, marker or None)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
            state, ppid, pgid = stat[stat.rindex(b")") + 2 :].split()[:3]  # the name may hold spaces
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except (OSError, ValueError):
            continue  # gone meanwhile, or not ours
        if state in (b"Z", b"X"):
            continue  # a zombie holds nothing
        prefix = MARKER.encode() + b"="
        marker = next((v[len(prefix) :].decode(errors="replace") for v in environ if v.startswith(prefix)), None)
        found.append((int(entry), int(ppid), int(pgid), marker))
    return found


def marked(marker):
    """Picks the processes carrying a session's marker."""
    return lambda processes: [pid for pid, _, _, found in processes if found == marker]


def step_processes(shell, group, since=None, shells=frozenset):
    """Picks a step's processes: its process group, and every descendant of its shell, even one
    that left the group (`setsid`). A descendant found once stays picked after its parent died.
    Once the shell has ended, its orphans are our children (we are a subreaper): with `since`
    (the shell's start time), every child of ours that is not a live step shell (`shells()`) and
    started since is picked too, with its descendants. (Told apart by start time, a step of
    another session running meanwhile may lose its leftovers too: an executor that runs steps
    side by side gives each its own reaper, as the shell executor does.)"""
    tree = {shell}

    def select(processes):
        children = {}
        for pid, ppid, _, _ in processes:
            children.setdefault(ppid, []).append(pid)
        if since is not None:
            live = shells()
            for pid, ppid, _, _ in processes:
                if ppid == os.getpid() and pid not in live and (started_at(pid) or 0) >= since:
                    tree.add(pid)
        todo = list(tree)
        while todo:
            for child in children.get(todo.pop(), []):
                if child not in tree:
                    tree.add(child)
                    todo.append(child)
        return [pid for pid, _, pgid, _ in processes if pgid == group or pid in tree]

    return select


def terminate(select):
    """SIGTERM every process select(processes) picks from a scan of /proc, SIGKILL what is left
    after GRACE. Children forked meanwhile are picked too. Returns the pids signalled."""
    signalled, started = set(), time.monotonic()
    while True:
        picked = select(scan_processes())
        elapsed = time.monotonic() - started
        if not picked or elapsed > 2 * GRACE:
            return signalled
        for pid in picked:
            if elapsed >= GRACE or pid not in signalled:
                try:
                    os.kill(pid, signal.SIGKILL if elapsed >= GRACE else signal.SIGTERM)
                except ProcessLookupError:
                    pass
            signalled.add(pid)
        time.sleep(0.02)


# --- Sessions: a folder per session, named after the runner id and the session id ------------


class Session:
    def __init__(self, id, root, runner_id, keep):
        self.id, self.root, self.keep = id, root, keep
        self.marker = f"{runner_id}/{id}"

    def folder(self, name):
        return os.path.join(self.root, name)

    def resolve(self, path):
        """A path the runner gave (absolute, or relative to the work folder) that must stay inside
        the session, even once symbolic links are followed."""
        full = os.path.normpath(os.path.join(self.folder("work"), path))
        outside = RpcError(CONFIGURATION, f"path {path} is outside session {self.id}")
        if ".." in PurePosixPath(path).parts or not full.startswith(self.root + "/"):
            raise outside
        existing = full
        while not os.path.lexists(existing):
            existing = os.path.dirname(existing)
        if not (os.path.realpath(existing) + "/").startswith(self.root + "/"):
            raise outside
        return full


def remove_session(session_id, root, marker):
    """Kills the processes carrying the session's marker, then deletes its folder."""
    removed = [
        {"kind": "process", "name": str(pid), "session": session_id}
        for pid in terminate(marked(marker))
    ]

    if os.path.lexists(root):
        try:
            try:
                shutil.rmtree(root)
            except PermissionError:  # a step may leave read-only folders (Go's module cache does)
                os.chmod(root, 0o700)
                for folder, subfolders, _ in os.walk(root):
                    for name in subfolders:
                        if not os.path.islink(os.path.join(folder, name)):
                            os.chmod(os.path.join(folder, name), 0o700)
                shutil.rmtree(root)
        except OSError as error:
            raise RpcError(INFRASTRUCTURE, f"cannot remove the session folder {root}: {error}")
        removed.append({"kind": "folder", "name": root, "session": session_id})
    return removed


# --- Tar streams on the side channel --------------------------------------------------------


class Channel:
    """The side channel: one connection to the runner's Unix socket, counting every byte that
    crosses it, bounded by max_bytes, the request's deadline and its cancellation."""

    def __init__(self, request, path, max_bytes):
        self.request, self.max_bytes, self.bytes = request, max_bytes, 0
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(max(0.001, request.deadline - time.monotonic()))
        try:
            self.sock.connect(path)
        except TimeoutError:
            raise RpcError(TIMEOUT, f"cannot connect to the channel {path} in time")
        except OSError as error:
            raise RpcError(INFRASTRUCTURE, f"cannot connect to the channel {path}: {error}")

    def _retry(self, operation):
        """Runs a socket operation, checking the deadline and cancel at least every 0.2 s."""
        while True:
            if self.request.cancelled.is_set():
                raise RpcError(CANCELLED, "cancelled")
            remaining = self.request.deadline - time.monotonic()
            if remaining <= 0:
                raise RpcError(TIMEOUT, f"the transfer ran past its timeout of {self.request.timeout_ms} ms")
            self.sock.settimeout(min(remaining, 0.2))
            try:
                return operation()
            except TimeoutError:
                continue

    def read(self, size=CHUNK):  # tarfile reads the upload through this
        data = self._retry(lambda: self.sock.recv(size if size > 0 else CHUNK))
        self.bytes += len(data)
        if self.bytes > self.max_bytes:
            raise RpcError(TOO_LARGE, f"the upload is longer than its max_bytes of {self.max_bytes}")
        return data

    def write(self, data):  # tarfile writes the download through this
        if self.bytes + len(data) > self.max_bytes:
            raise RpcError(TOO_LARGE, f"the download would pass its max_bytes of {self.max_bytes}")
        view = memoryview(data)
        while view:
            sent = self._retry(lambda: self.sock.send(view))
            view, self.bytes = view[sent:], self.bytes + sent
        return len(data)

    def close(self):
        self.sock.close()


def vet(member, dest):
    """Refuses (TOO_LARGE, as the protocol says) a tar entry that could write outside dest."""
    path = PurePosixPath(member.name)

    def refuse(why):
        raise RpcError(TOO_LARGE, f"refused tar entry {member.name!r}: {why}")

    if path.is_absolute() or ".." in path.parts:
        refuse("absolute path or .. component")
    if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
        refuse("not a file, folder or link")
    if member.issym():
        depth = len(path.parts) - 1  # how deep the link's own folder is, from the archive's root
        if member.linkname.startswith("/"):
            refuse("absolute link target")
        for part in PurePosixPath(member.linkname).parts:
            depth += -1 if part == ".." else 0 if part == "." else 1
            if depth < 0:
                refuse("link target leaves the tree")
    if member.islnk() and (member.linkname.startswith("/") or ".." in PurePosixPath(member.linkname).parts):
        refuse("hard link target outside the archive")
    # Never write through a link that already leads outside (a link an earlier entry made).
    target = os.path.join(dest, member.name)
    real = os.path.realpath(os.path.dirname(target) if member.issym() else target)
    if real != dest and not real.startswith(dest + "/"):
        refuse("it would be written outside the destination")


# Python 3.12 and later warn when extract() is called without a filter; we vet entries ourselves.
EXTRACT_ARGS = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}


def check_links(links, dest):
    """Every link unpacked so far still leads inside dest: a link made later can make an earlier
    one leave (`l2 -> a/l1/..` then `a/l1 -> ..`). A loop of links is refused too."""
    for link in links:
        try:
            real = os.path.realpath(os.path.join(dest, link), strict=True)
        except FileNotFoundError:
            real = os.path.realpath(os.path.join(dest, link))  # leads to what is not there yet
        except OSError:
            raise RpcError(TOO_LARGE, f"refused tar entry {link!r}: a loop of links")
        if real != dest and not real.startswith(dest + "/"):
            raise RpcError(TOO_LARGE, f"refused tar entry {link!r}: with the links after it, it leaves the tree")


def unpack(channel, dest):
    folders = []  # folder modes and times are set last, once their files are written
    links = []  # the symbolic links unpacked, checked again after each new one
    with tarfile.open(fileobj=channel, mode="r|") as tar:  # plain tar, read as a stream
        for member in tar:
            if member.name.strip("/") in ("", "."):
                continue  # the root itself
            vet(member, dest)
            member.mode &= 0o777  # no setuid, setgid or sticky bits
            member.uid, member.gid, member.uname, member.gname = os.getuid(), os.getgid(), "", ""  # owners not kept
            if member.isdir():
                folders.append((os.path.join(dest, member.name), member.mode, member.mtime))
                member.mode = 0o700
            tar.extract(member, dest, **EXTRACT_ARGS)
            if member.issym():
                links.append(member.name)
                check_links(links, dest)
    for path, mode, mtime in reversed(folders):
        os.chmod(path, mode)
        os.utime(path, (mtime, mtime))
    while channel.read():  # the end-of-archive blocks may be followed by padding: count it all
        pass


def pack(channel, source):
    """Writes the tree as tar; returns what it left out, each with why."""
    skipped = []
    with tarfile.open(fileobj=channel, mode="w|") as tar:  # pax headers, long names included
        for folder, subfolders, files in os.walk(source):  # links are archived, never followed
            subfolders.sort()
            for name in subfolders + sorted(files):
                path = os.path.join(folder, name)
                member = tar.gettarinfo(path, arcname=os.path.relpath(path, source))
                why = left_out(member)
                if why:
                    skipped.append((member.name, why))
                elif member.isreg():
                    with open(path, "rb") as data:
                        tar.addfile(member, data)
                else:
                    tar.addfile(member)
    return skipped


def left_out(member):
    """Why an entry may not go into the stream, if it may not: files, folders and links that stay
    inside only, as the runner accepts."""
    if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
        return "a FIFO, a socket or a device node"
    if member.issym():
        leaves = "a symbolic link whose target leaves the folder"
        if member.linkname.startswith("/"):
            return leaves
        depth = len(PurePosixPath(member.name).parts) - 1
        for part in PurePosixPath(member.linkname).parts:
            depth += -1 if part == ".." else 0 if part == "." else 1
            if depth < 0:
                return leaves
    return None


# --- The executor: one thread per request, shared state under one lock ----------------------


class Request:
    def __init__(self, id, method, params, timeout_ms):
        self.id, self.method, self.params, self.cancelled = id, method, params, threading.Event()
        self.timeout_ms = timeout_ms
        # Deadlines count from the moment the request was read.
        self.deadline = time.monotonic() + timeout_ms / 1000 if timeout_ms is not None else None


class Executor:
    def __init__(self):
        self.wire = Wire()
        self.lock = threading.Lock()
        self.config = None  # set by a successful initialize
        self.sessions = {}  # session id -> Session
        self.in_flight = {}  # request id -> (Request, thread)
        self.shells = set()  # the pids of the steps' shells still running

    # --- Handshake and version negotiation -------------------------------------------------

    def initialize(self, request):
        params = request.params
        offered = field(params, "protocol_versions", list)
        common = [version for version in SUPPORTED_VERSIONS if version in offered]
        if not common:  # the version is checked before the configuration
            raise RpcError(
                UNSUPPORTED_VERSION,
                f"the runner offers protocol versions {offered}; executor {NAME} {VERSION} speaks {SUPPORTED_VERSIONS}",
                {"offered": offered, "supported": SUPPORTED_VERSIONS},
            )
        runner_id = field(field(params, "runner", dict), "id", str)
        config = field(params, "config", dict, {})
        for key in sorted(config):
            if key not in OPTIONS:
                raise RpcError(CONFIGURATION, f"unknown option --{key} for the {NAME} executor")
        if not safe_name(runner_id):
            raise RpcError(CONFIGURATION, f"runner id {runner_id!r} is not a safe folder name")
        work_dir = config.get("work-dir") or os.path.join(os.environ.get("TMPDIR") or "/tmp", "knotless-python")
        if not os.path.isabs(work_dir):
            raise RpcError(CONFIGURATION, f"option --work-dir must be an absolute path, not {work_dir}")
        try:
            os.makedirs(os.path.join(work_dir, runner_id), mode=0o700, exist_ok=True)
        except OSError as error:
            raise RpcError(CONFIGURATION, f"option --work-dir: cannot create {work_dir}/{runner_id}: {error}")
        self.config = {
            "runner_dir": os.path.join(os.path.realpath(work_dir), runner_id),
            "runner_id": runner_id,
            "path": os.environ.get("PATH") or "/usr/local/bin:/usr/bin:/bin",
        }
        diag(f"sessions in {self.config['runner_dir']}; steps run on the host, isolated from nothing")
        return {
            "protocol_version": max(common),
            "executor": {"name": NAME, "version": VERSION},
            "capabilities": {"isolation": "none", "secrets": True, "outputs": True},
        }

    def ping(self, request):
        return {}

    # --- Sessions ------------------------------------------------------------------------

    def session(self, params):
        session_id = field(params, "session", str)
        with self.lock:
            if session_id not in self.sessions:
                raise RpcError(UNKNOWN_SESSION, f"unknown session {session_id}")
            return self.sessions[session_id]

    def start(self, request):
        session_id = field(request.params, "session", str)
        keep = field(request.params, "keep", bool, False)
        if not safe_name(session_id):
            raise RpcError(CONFIGURATION, f"session id {session_id!r} is not a safe folder name")
        root = os.path.join(self.config["runner_dir"], session_id)
        try:
            os.mkdir(root, 0o700)  # fails if it exists: two sessions never share a folder
        except FileExistsError:
            raise RpcError(CONFIGURATION, f"session {session_id} already exists at {root}")
        except OSError as error:
            raise RpcError(INFRASTRUCTURE, f"cannot create the session folder {root}: {error}")
        session = Session(session_id, root, self.config["runner_id"], keep)
        try:
            for name in ("work", "steps", "outputs", "home"):
                os.mkdir(session.folder(name), 0o700)
            if keep:  # marks the folder for cleanup to spare
                open(session.folder("kept"), "w").close()
        except OSError as error:
            shutil.rmtree(root, ignore_errors=True)  # a failed start leaves nothing behind
            raise RpcError(INFRASTRUCTURE, f"cannot create the session's folders in {root}: {error}")
        if request.params.get("image"):
            self.log(session_id, "warn", f"{NAME} ignores the image {request.params['image']}: steps run on the host")
        with self.lock:
            self.sessions[session_id] = session
        paths = {name: session.folder(name) for name in ("work", "steps", "outputs")}
        return {"paths": paths, "description": f"folder {root}"}

    def stop(self, request):
        session = self.session(request.params)
        with self.lock:
            self.sessions.pop(session.id, None)  # from now on the session is unknown
        if field(request.params, "keep", bool, False) or session.keep:
            open(session.folder("kept"), "w").close()
            self.log(session.id, "info", f"kept the session folder {session.root}")
            return {"removed": []}
        return {"removed": remove_session(session.id, session.root, session.marker)}

    def cleanup(self, request):
        """The orphan sweep: every session folder and marked process of this runner id that belongs
        to no session in keep, including those a previous executor process left; kept sessions
        only with remove_kept."""
        keep = set(field(request.params, "keep", list, []))
        remove_kept = field(request.params, "remove_kept", bool, False)
        runner_dir, prefix = self.config["runner_dir"], self.config["runner_id"] + "/"
        try:
            folders = {name for name in os.listdir(runner_dir) if os.path.isdir(os.path.join(runner_dir, name))}
        except OSError as error:
            raise RpcError(INFRASTRUCTURE, f"cannot list {runner_dir}: {error}")
        kept = {name for name in folders if os.path.exists(os.path.join(runner_dir, name, "kept"))}
        if remove_kept:
            kept = set()
        # A session's processes may outlive its folder: they carry its marker.
        alive = {marker[len(prefix) :] for *_, marker in scan_processes() if marker and marker.startswith(prefix)}
        removed, failures = [], []
        for session_id in sorted((folders | alive) - kept - keep):
            if not safe_name(session_id):
                failures.append(f"left {session_id!r} in {runner_dir}: not a session folder")
                continue
            with self.lock:
                self.sessions.pop(session_id, None)
            try:
                removed += remove_session(session_id, os.path.join(runner_dir, session_id), prefix + session_id)
            except RpcError as error:
                failures.append(error.message)
        diag(f"orphan sweep: removed {len(removed)} resource(s), {len(failures)} failure(s)")
        return {"removed": removed, "failures": failures}

    # --- Running a step ------------------------------------------------------------------

    def command(self, request):
        params = request.params
        session = self.session(params)
        step, script = field(params, "step", int), field(params, "script", str)
        name = field(params, "name", str, "") or str(step)
        env, secrets = field(params, "env", dict, {}), field(params, "secrets", dict, {})
        workdir = session.resolve(field(params, "workdir", str, session.folder("work")))
        if not os.path.isdir(workdir):
            raise RpcError(CONFIGURATION, f"cannot run step {name}: no folder {workdir}")
        # A cleared environment: nothing of ours, only what the step is given (secrets too).
        step_env = {"PATH": self.config["path"], "HOME": session.folder("home"), **env, **secrets}
        step_env[MARKER] = session.marker
        started = time.monotonic()
        try:
            with self.lock:  # known as a step's shell before a sweep can take it for an orphan
                shell = subprocess.Popen(
                    ["/bin/sh", "-ec", script],  # the script on argv; secrets only in the environment
                    cwd=workdir,
                    env=step_env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,  # its own process group (and session), which we kill as one
                )
                self.shells.add(shell.pid)
                shell.started_at = started_at(shell.pid) or 0
        except (OSError, ValueError) as error:
            raise RpcError(INFRASTRUCTURE, f"cannot start /bin/sh for step {name}: {error}")
        try:
            return self.run_step(request, session, name, step, secrets, shell, started)
        finally:
            with self.lock:
                self.shells.discard(shell.pid)
                reap_orphans(self.shells)

    def live_shells(self):
        with self.lock:
            return set(self.shells)

    def run_step(self, request, session, name, step, secrets, shell, started):
        group = shell.pid
        pipes = selectors.DefaultSelector()
        pipes.register(shell.stdout, selectors.EVENT_READ, "stdout")
        pipes.register(shell.stderr, selectors.EVENT_READ, "stderr")

        def pump(timeout):
            """Sends what the pipes hold as `output` notifications, waiting at most timeout."""
            if not pipes.get_map():  # both closed: nothing to wait for
                time.sleep(timeout)
                return
            for key, _ in pipes.select(timeout):
                data = os.read(key.fd, CHUNK)
                if data:
                    b64 = base64.b64encode(data).decode()
                    self.wire.notify("output", {"session": session.id, "step": step, "stream": key.data, "data": b64})
                else:
                    pipes.unregister(key.fileobj)

        def drain():
            """Reads on until both pipes close, or SETTLE passes: a process left running in the
            background (`sleep 100 &`) holds them open, and the step must not wait for it."""
            settle = time.monotonic() + SETTLE
            while pipes.get_map() and time.monotonic() < settle:
                pump(max(0, settle - time.monotonic()))
            pipes.close()
            shell.stdout.close()
            shell.stderr.close()

        ending = None
        while ending is None:
            pump(0.05)
            if shell.poll() is not None:
                break
            if request.cancelled.is_set():
                ending = RpcError(CANCELLED, "cancelled")
            elif time.monotonic() >= request.deadline:
                ending = RpcError(TIMEOUT, f"step {name} ran past its timeout of {request.timeout_ms} ms and was killed")
        duration_ms = int((time.monotonic() - started) * 1000)
        processes = step_processes(shell.pid, group)
        if ending is not None:  # timeout or cancel: kill the step's processes, then answer the error
            terminate(processes)
            shell.wait()
            drain()
            self.log(session.id, "error" if ending.code == TIMEOUT else "info", f"step {name}: {ending.message}")
            raise ending
        killed = set()
        if secrets:  # nothing that saw a secret may outlive the step, however it left its tree
            killed = terminate(step_processes(shell.pid, group, shell.started_at, self.live_shells))
            if killed:
                self.log(session.id, "warn", f"step {name} left {len(killed)} process(es) running: killed them")
        drain()  # every output notification is written before the response
        code = shell.returncode
        return {"exit_code": 128 - code if code < 0 else code, "duration_ms": duration_ms, "killed_processes": len(killed)}

    # --- The side channel ----------------------------------------------------------------

    def transfer(self, request):
        session = self.session(request.params)
        path = session.resolve(field(request.params, "path", str))
        channel_path = field(request.params, "channel", str)
        max_bytes = field(request.params, "max_bytes", int)
        if request.method == "download" and not os.path.lexists(path):
            raise RpcError(NOT_FOUND, f"no path {request.params['path']} in session {session.id}")
        if request.method == "download" and not os.path.isdir(path):
            raise RpcError(CONFIGURATION, f"cannot download {path}: not a folder")
        channel = Channel(request, channel_path, max_bytes)  # connect once, and only to this channel
        try:
            if request.method == "upload":
                os.makedirs(path, exist_ok=True)
                unpack(channel, os.path.realpath(path))
            else:
                for name, why in pack(channel, path):
                    self.log(session.id, "warn", f"left {name} out of the download of {path}: {why}")
                channel.sock.shutdown(socket.SHUT_WR)  # end of stream for the runner
        except tarfile.TarError as error:
            raise RpcError(INFRASTRUCTURE, f"bad tar stream for {path}: {error}")
        except OSError as error:
            raise RpcError(INFRASTRUCTURE, f"cannot {request.method} {path}: {error}")
        finally:
            channel.close()
        return {"bytes": channel.bytes}

    upload = download = transfer

    # --- Dispatch, cancel, shutdown and the end of stdin ------------------------------------

    def log(self, session_id, level, message):
        params = {"level": level, "message": message}
        if session_id is not None:
            params["session"] = session_id
        self.wire.notify("log", params)

    def handle(self, request, method):
        try:
            self.wire.result(request.id, method(request))
        except RpcError as error:
            self.wire.error(request.id, error.code, error.message, error.data)
        except Exception as error:  # a bug of ours: say so, and keep serving
            diag(f"internal error in {request.method}: {error!r}")
            self.wire.error(request.id, INTERNAL, f"internal error in {request.method}: {error}")
        finally:
            with self.lock:
                self.in_flight.pop(request.id, None)

    def receive(self, message):
        if not isinstance(message, dict):
            return self.wire.error(None, INVALID_REQUEST, "a message must be one JSON object")
        params = message.get("params", {})
        if "id" not in message:  # a notification: cancel, or one we ignore
            target = params.get("id") if isinstance(params, dict) else None
            if message.get("method") == "cancel" and isinstance(target, (int, str)):
                with self.lock:
                    entry = self.in_flight.get(target)
                if entry:  # a cancel for a request not in flight is ignored
                    entry[0].cancelled.set()
            return
        id, method = message["id"], message.get("method")
        if not (isinstance(id, str) or (isinstance(id, int) and not isinstance(id, bool) and id >= 0)):
            return self.wire.error(None, INVALID_REQUEST, "a request id must be a non-negative integer or a string")
        if not isinstance(method, str):
            return self.wire.error(id, INVALID_REQUEST, "a request needs a method")
        if not isinstance(params, dict):
            return self.wire.error(id, INVALID_PARAMS, "params must be an object")
        if method == "shutdown":
            self.finish(f"shutdown (request {id})")
            self.wire.result(id, {})
            sys.exit(0)
        handler = getattr(self, method, None) if method in METHODS else None
        if handler is None:
            return self.wire.error(id, METHOD_NOT_FOUND, f"unknown method {method}")
        if self.config is None and method != "initialize":
            return self.wire.error(id, NOT_INITIALIZED, "initialize first")
        try:
            timeout_ms = field(params, "timeout_ms", int) if method in TIMED else None
        except RpcError as error:
            return self.wire.error(id, error.code, error.message)
        if timeout_ms == 0 and method != "command":  # a deadline already passed: do nothing
            return self.wire.error(id, TIMEOUT, f"{method} was given a timeout_ms of 0: its deadline has passed")
        request = Request(id, method, params, timeout_ms)
        thread = threading.Thread(target=self.handle, args=(request, handler), daemon=True)
        with self.lock:
            self.in_flight[id] = (request, thread)
        thread.start()

    def finish(self, why):
        """shutdown and the end of stdin: cancel what is in flight, wait for its answers, stop
        every session that is not kept."""
        diag(f"{why}: cancelling {len(self.in_flight)} request(s), stopping {len(self.sessions)} session(s)")
        with self.lock:
            in_flight = list(self.in_flight.values())
        for request, _ in in_flight:
            request.cancelled.set()
        for _, thread in in_flight:
            thread.join(timeout=4 * GRACE)
        with self.lock:
            sessions, self.sessions = list(self.sessions.values()), {}
        for session in sessions:
            if not session.keep:
                try:
                    remove_session(session.id, session.root, session.marker)
                except RpcError as error:
                    diag(error.message)

    def serve(self):
        stdin = sys.stdin.buffer
        while True:
            line = stdin.readline(MAX_FRAME + 1)
            if not line:
                break  # end of stdin: the runner is gone
            if len(line) > MAX_FRAME:
                self.wire.error(None, PARSE_ERROR, f"a frame is longer than {MAX_FRAME} bytes")
                break  # we cannot find the next frame: handled like the end of stdin
            try:
                message = json.loads(line.removesuffix(b"\n").removesuffix(b"\r"))
            except ValueError as error:
                self.wire.error(None, PARSE_ERROR, f"not JSON: {error}")
                continue
            self.receive(message)
        self.finish("end of stdin")


METHODS = {"initialize", "ping", "start", "command", "stop", "cleanup", "upload", "download"}
TIMED = {"start", "command", "stop", "cleanup", "upload", "download"}  # requests with a timeout_ms

if __name__ == "__main__":
    become_subreaper()
    Executor().serve()
