"""The trust boundary: where the trusted party's clip and noise sit, and which side of
it each client-side stage runs on.

A privacy mechanism declares where its guarantee starts (`Mechanism.boundary`):

  server   the trusted server receives the uploads: it clips each one it receives,
           after whatever the client did (a malicious client's replacement or
           boost included), and noises their sum. Every client-side stage runs
           before it, so the sum's sensitivity is the clip norm by construction.
  client   each client clips and noises its own report before it leaves: whatever
           acts on the report as sent (a malicious client's replacement) runs after
           it and is post-processing of that report.

A client-side stage declares where it acts (`StagePlacement`):

  protocol  inside the honest client's update (local training, the upload
            pipeline, an audit's canary client): before either boundary.
  sent      on the report a client sends (Byzantine replacements, a backdoor's
            boost): before a server boundary, after a client one.

and whether it reads other clients' uploads (the colluding attacks). Such a stage
before a server boundary would carry every honest update it reads into its own
upload before the server's noise: one client's data would then move several
clipped uploads, beyond the sensitivity the accountant charges, so `problem`
refuses it. The round runs each stage on its side (core/client_phase.py); no
stage is placed by its name.
"""

from __future__ import annotations

from typing import NamedTuple

BOUNDARIES = ("server", "client")


class StagePlacement(NamedTuple):
  """A client-side stage's static placement (see the module docstring)."""
  acts_on: str = "protocol"          # 'protocol' | 'sent'
  reads_other_uploads: bool = False  # reads the cohort's other uploads (collusion)


def before_boundary(boundary: str | None, stage: StagePlacement) -> bool:
  """Whether `stage` runs before the mechanism's clip (and noise) under `boundary`
  (None: no mechanism, where a 'sent' stage acts on the uploads as they are sent)."""
  if stage.acts_on == "protocol":
    return True
  return boundary == "server"


def problem(boundary: str | None, stage: StagePlacement) -> str | None:
  """Why `stage` breaks the sensitivity a mechanism with `boundary` accounts, or None."""
  if boundary is None or not stage.reads_other_uploads or not before_boundary(boundary, stage):
    return None
  return ("the colluders read the other clients' uploads before the server's clip and noise, "
          "so one client's data would move several clipped uploads, beyond the sensitivity "
          "the accountant charges (use dp 'local', where they read the noised reports)")
