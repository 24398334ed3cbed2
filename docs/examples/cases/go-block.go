package main

import (
	"fmt"
	"strings"
)

// wordFrequencies counts each lower-cased word in text.
func wordFrequencies(text string) map[string]int {
	counts := make(map[string]int)
	for _, word := range strings.Fields(text) {
		‸
	}
	return counts
}

func main() {
	for word, n := range wordFrequencies("the cat and the hat") {
		fmt.Println(word, n)
	}
}
