# attacks: a set comprehension over the cartesian product of three ranges (10^12 elements)
# expect: deny
package wb.admission

triples := {[i, j, k] |
	some i in numbers.range(1, 10000)
	some j in numbers.range(1, 10000)
	some k in numbers.range(1, 10000)
}

deny contains "never" if count(triples) < 0
