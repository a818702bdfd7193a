"""What a run's privacy report says, read from the simulation, its config and the
privacy log (moved out of privacy/, which holds what runs in or accounts the round):

  privacy_report.py   the report: header, headline epsilon, assumptions, the sections
  local_dp_report.py  local DP's section (per-client ledgers)
  topksdp_privacy.py  TopkSDP-FL's kept-noise section (the paper's chain beside ours)
  privacy_log.py      the per-round record of what was released, for the report
"""
