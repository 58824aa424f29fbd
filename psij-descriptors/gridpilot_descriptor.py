"""Registers gridpilot's PSI/J executor: ``psij.JobExecutor.get_instance("gridpilot", url=...)``.

PSI/J reads every ``psij-descriptors`` folder on ``sys.path``; the executor's module must lie
under the same folder as this one (``client/psij_executor.py`` beside ``psij-descriptors/``).
"""

from packaging.version import Version
from psij.descriptor import Descriptor

__PSI_J_EXECUTORS__ = [
    Descriptor(name="gridpilot", nice_name="gridpilot", version=Version("0.1.0"),
               cls="client.psij_executor.GridpilotJobExecutor"),
]
