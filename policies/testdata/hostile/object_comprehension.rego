# attacks: an object comprehension with ten million keys, each a formatted string
# expect: deny
package wb.admission

big := {sprintf("key-%d-%s", [i, "padding-padding-padding-padding"]): [i, i, i] | some i in numbers.range(1, 10000000)}

deny contains "never" if count(big) < 0
