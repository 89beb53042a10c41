package segment

// PlanMs is planMs for the tests: Plan with the service time as
// milliseconds since snowflake.Epoch.
func (p Policy) PlanMs(hwm, nowMs, n int64) (lo, hi int64, err error) { return p.planMs(hwm, nowMs, n) }
