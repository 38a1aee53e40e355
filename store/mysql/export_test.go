package mysql

// CandidatesSQL is the claim's candidate statement, for tests that hold its
// locks open.
var CandidatesSQL = lockCandidates
