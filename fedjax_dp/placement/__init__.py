"""Where things live: devices, the federated store on them, cohort sampling."""
