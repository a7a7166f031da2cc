package prefixdv1

// MatchRequest was Match's request; Query replaced it under the same field
// numbers.
//
// Deprecated: use Query, the request of both Match and Score.
type MatchRequest = Query

// ScoreRequest was Score's request; Query replaced it under the same field
// numbers.
//
// Deprecated: use Query, the request of both Match and Score.
type ScoreRequest = Query
