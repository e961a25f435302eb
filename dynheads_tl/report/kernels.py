"""The notebooks' kernels: each on IPC sockets in a private folder of its own, and what to say when one does not
start or dies (issue #65: two reports started together from one checkout took the same socket names).

The runner (:mod:`dynheads_tl.report.runner`) starts one kernel per notebook through papermill with
:func:`ipc_kernel_manager` and turns a kernel's failure into a :class:`KernelError` with :func:`kernel_failure`.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile

# Each kernel's sockets and connection file live in a folder of its own, made when the kernel starts and removed when
# it is shut down: ``<temp>/dynheads-kernel-<pid>-<random>/`` (the pid of the run that made it, so that a later run
# can remove what a killed one left). jupyter_client's default names the sockets ``kernel-ipc-1`` … in the working
# folder, where two runs that start a kernel within the same second take the same names (issue #65).
KERNEL_FOLDER_PREFIX = "dynheads-kernel-"
_SOCKET_PATH_LIMIT = 100  # a Unix socket's path holds at most 107 bytes (104 on macOS); sockets are <folder>/kernel-N


def _kernel_folder_base() -> str:
    """The system's temporary folder, or ``/tmp`` where that is too long a path for a socket in it."""
    base = tempfile.gettempdir()
    longest = len(os.path.join(base, f"{KERNEL_FOLDER_PREFIX}{2**22}-{'x' * 8}", "kernel-99"))
    if longest > _SOCKET_PATH_LIMIT and os.path.isdir("/tmp") and os.access("/tmp", os.W_OK | os.X_OK):
        return "/tmp"
    return base


def _uid() -> int | None:
    return os.getuid() if hasattr(os, "getuid") else None


def _process_is_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # PermissionError: another user's process, alive
        return False
    return False


def remove_stale_kernel_folders(base: str | None = None) -> list[str]:
    """Remove the kernel folders that runs which are no longer running left (a run killed with SIGKILL cannot remove
    its own): this user's ``dynheads-kernel-<pid>-*`` folders whose pid is gone. Returns their paths."""
    base = base or _kernel_folder_base()
    removed = []
    try:
        entries = list(os.scandir(base))
    except OSError:
        return removed
    for entry in entries:
        pid = entry.name[len(KERNEL_FOLDER_PREFIX):].partition("-")[0]
        if not (entry.name.startswith(KERNEL_FOLDER_PREFIX) and pid.isdigit()):
            continue
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat(follow_symlinks=False).st_uid != _uid():
                continue
        except OSError:
            continue
        if int(pid) != os.getpid() and _process_is_gone(int(pid)):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
    return removed


def make_kernel_folder() -> str:
    """A new private folder (mode 0700) for one kernel's sockets and connection file; earlier runs' leftovers are
    removed first (:func:`remove_stale_kernel_folders`)."""
    base = _kernel_folder_base()
    remove_stale_kernel_folders(base)
    return tempfile.mkdtemp(prefix=f"{KERNEL_FOLDER_PREFIX}{os.getpid()}-", dir=base)


def ipc_kernel_manager(stderr=None):
    """The kernel manager the notebooks run under: jupyter_client's, on IPC (Unix domain sockets) instead of TCP on
    localhost. The kernel is local either way; over TCP without encryption ipykernel 7 prints a warning about
    plain-text traffic into every run's log, and a local socket needs no port.

    Each kernel's sockets (``kernel-1`` … ``kernel-5``) and connection file (``kernel.json``, with the key that signs
    its messages) are in a private folder of its own (:func:`make_kernel_folder`), made when the kernel starts, kept
    across an automatic restart and removed when it is shut down; the class's ``remove_kernel_folders()`` removes
    those of every kernel it started (the runner calls it after each notebook, also after a failure or Ctrl-C). Two
    runs started together from one checkout therefore never share a socket, and nothing is written into the working
    folder (jupyter_client's default for IPC is ``kernel-ipc-N`` there).

    ``stderr``: a file the kernel process's own stderr goes to instead of the terminal (what the kernel application
    logs itself; a cell's output goes to the notebook either way). The runner passes one per notebook and repeats it
    after the notebook, unless the run was interrupted: a kernel stopped mid-cell logs a traceback of its closed
    sockets, which is not the user's business."""
    from jupyter_client.manager import AsyncKernelManager

    folders: list[str] = []

    class IPCKernelManager(AsyncKernelManager):
        kernel_folder: str | None = None

        def __init__(self, **kwargs):
            kwargs.setdefault("transport", "ipc")
            super().__init__(**kwargs)

        async def _async_pre_start_kernel(self, **kw):
            if self.transport == "ipc" and self.kernel_folder is None:  # a restart keeps its folder
                self.kernel_folder = make_kernel_folder()
                folders.append(self.kernel_folder)
                self.ip = os.path.join(self.kernel_folder, "kernel")
                self.connection_file = os.path.join(self.kernel_folder, "kernel.json")
            return await super()._async_pre_start_kernel(**kw)

        async def _async_launch_kernel(self, kernel_cmd, **kw):
            if stderr is not None:
                kw.setdefault("stderr", stderr)
            return await super()._async_launch_kernel(kernel_cmd, **kw)

        async def _async_cleanup_resources(self, restart: bool = False) -> None:
            try:
                await super()._async_cleanup_resources(restart=restart)
            finally:
                if not restart and self.kernel_folder is not None:
                    shutil.rmtree(self.kernel_folder, ignore_errors=True)
                    self.kernel_folder = None

        cleanup_resources = _async_cleanup_resources

        @staticmethod
        def remove_kernel_folders() -> None:
            while folders:
                shutil.rmtree(folders.pop(), ignore_errors=True)

    return IPCKernelManager


class KernelError(RuntimeError):
    """A notebook's kernel did not start, did not answer or died: what happened and what to do, in one paragraph."""


def _kernel_failure(error: BaseException, stem: str, logged: bool) -> KernelError | None:
    """The :class:`KernelError` that explains ``error``, when it is a kernel's failure to start, to answer or to
    stay alive (not a cell's error, which papermill reports as :class:`papermill.PapermillExecutionError`)."""
    from nbclient.exceptions import DeadKernelError

    text = str(error)
    log = (f"its own log is above (the lines \"{stem} kernel: …\")" if logged
           else "it wrote nothing on its own stderr")
    retry = ("Run the same command again: finished traces and ablation runs are cached, so it resumes from where it "
             "stopped.")
    check = (f"check that the kernel can start in this environment: `{sys.executable} -m ipykernel_launcher "
             "--version` prints a version, and `jupyter kernelspec list` shows no python3 kernel of another "
             "environment")
    if isinstance(error, DeadKernelError) or (text.startswith("Kernel died") and "before replying" not in text):
        return KernelError(
            f"{stem}: the notebook's kernel died while it ran ({type(error).__name__}: {text}); {log}. A kernel dies "
            "without a Python error when the system stops it, most often for lack of memory (look for the out-of-"
            f"memory killer in `dmesg` or the system log); close other programs or use smaller parameters. {retry}")
    if isinstance(error, RuntimeError) and text.startswith("Kernel didn't respond"):
        return KernelError(
            f"{stem}: the notebook's kernel did not answer in time after it was started ({type(error).__name__}: "
            f"{text}); {log}. Most likely the machine is overloaded: other runs or programs hold its cores or memory, "
            f"so a new Python process takes longer than that to import its libraries. {retry} If it fails again on "
            f"an idle machine, {check}.")
    if isinstance(error, RuntimeError) and "before replying" in text:
        which = "; its log says which" if logged else ""
        return KernelError(
            f"{stem}: the notebook's kernel exited before it answered ({type(error).__name__}: {text}); {log}. "
            f"Most likely it cannot start in this environment (a missing or broken package{which}), or the system "
            f"stopped it for lack of memory. {check[0].upper()}{check[1:]}, then run the same command "
            "again: finished traces and ablation runs are cached, so it resumes from where it stopped.")
    return None
