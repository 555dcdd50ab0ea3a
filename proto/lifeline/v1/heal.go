package lifelinev1

// NodeNeverRunsAgain tells whether a worker in phase, under its pod's restartPolicy ("" is Always, the API's
// default), is one its node will never run again: its pod is gone, or its containers failed under Never. Only
// such a worker is rebuilt while its node is cut off, by the controller's command or the agent's offline
// policy; any other down worker the node restarts by itself under its crash back-off [P-CMD-6] [P-HEAL-1]. The
// controller and the agent decide by this one rule, so they never disagree on what to heal.
func NodeNeverRunsAgain(phase Phase, restartPolicy string) bool {
	return phase == Phase_PHASE_GONE || (phase == Phase_PHASE_FAILED && restartPolicy == "Never")
}
