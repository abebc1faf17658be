"""kbframe's Hydra launcher plugin. Hydra instantiates launchers only from the
``hydra_plugins`` namespace and imports every module here at start-up, so this module
stays light: the work is in kbframe/cli/launcher.py, imported when a sweep launches.
Selected by ``hydra/launcher=joblib`` (conf/hydra/launcher/joblib.yaml)."""
try:
    from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher as _HydraJoblibLauncher
except ImportError:  # the joblib extra is not installed: no launcher to offer
    _HydraJoblibLauncher = None

if _HydraJoblibLauncher is not None:
    class KbframeJoblibLauncher(_HydraJoblibLauncher):
        """Hydra's joblib launcher, one loky executor per parallel slot: a killed job
        fails alone (kbframe.cli.launcher)."""

        def launch(self, job_overrides, initial_job_idx):
            from kbframe.cli.launcher import launch
            return launch(self, job_overrides, initial_job_idx)
