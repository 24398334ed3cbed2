package geometry

import "math"

type Point struct {
	X, Y float64
}

// Distance is the Euclidean distance between p and q.
func Distance(p, q Point) float64 {
	dx := q.X - p.X
	dy := q.Y - p.Y
	return math.Sqrt(‸)
}
