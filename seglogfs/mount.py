"""``python -m seglogfs.mount LOGDIR MOUNTPOINT ...``: the daemon's older name.

The daemon lives in ``seglogfs.daemon`` (``python -m seglogfs.daemon``); this alias
keeps the command that earlier releases documented working.
"""

if __name__ == "__main__":
    import runpy

    runpy.run_module("seglogfs.daemon", run_name="__main__", alter_sys=True)
