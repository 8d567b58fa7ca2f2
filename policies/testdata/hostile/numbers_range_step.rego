# attacks: numbers.range_step over 2^62 numbers, big enough to be computed with big integers
# expect: deny
package wb.admission

deny contains "never" if count(numbers.range_step(1, 4611686018427387904, 1)) < 0
