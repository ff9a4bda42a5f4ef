# remem-bench compare: throughput vs value size and latency CDFs.
set terminal svg size 800,500 dynamic noenhanced
set grid
set key left top

set output 'throughput_C.svg'
set title 'YCSB-C: throughput vs value size'
set xlabel 'value size (bytes)'
set ylabel 'operations/s'
set logscale x 2
set logscale y 10
plot 'throughput_C.dat' using 1:2 with linespoints title 'remem', 'throughput_C.dat' using 1:3 with linespoints title 'redis', 'throughput_C.dat' using 1:4 with linespoints title 'memcached'

set output 'cdf_C.svg'
set title 'YCSB-C: latency CDF (16 B values)'
set xlabel 'latency (us)'
set ylabel 'fraction of requests'
set logscale x 10
unset logscale y
set key right bottom
plot 'cdf_C_remem.dat' using 1:2 with lines title 'remem', 'cdf_C_redis.dat' using 1:2 with lines title 'redis', 'cdf_C_memcached.dat' using 1:2 with lines title 'memcached'
set key left top
